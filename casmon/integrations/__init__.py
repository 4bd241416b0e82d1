"""Training frameworks log into casmon runs: one module per framework, each importing its framework on first use.

* :mod:`casmon.integrations.lightning` -- ``CasmonLogger``, a PyTorch Lightning ``Logger``.
* :mod:`casmon.integrations.transformers` -- ``CasmonCallback``, a Hugging Face ``TrainerCallback``.
* :mod:`casmon.integrations.keras` -- ``CasmonCallback``, a Keras 3 ``Callback``.
* :mod:`casmon.integrations.owner` -- the run they log into (given, active, or their own) and values made plain.

Importing this package, or one of its modules, imports no framework: the class is built when it is first asked for.
"""
