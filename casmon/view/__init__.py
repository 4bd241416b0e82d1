"""Views: text and HTML renderings, progress bars, and the one formatter of short texts.

A leaf: it imports no other casmon package and reads what it shows by duck
typing, so every layer may use it to show itself (``repr``, ``_repr_html_``).
``text`` formats sizes, counts, cut texts and short errors for every layer;
``display`` builds the views; ``progress`` draws the bars.
"""
