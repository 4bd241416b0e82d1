"""Views: text and HTML renderings and progress bars.

A leaf: it imports no other casmon package and reads what it shows by duck
typing, so every layer may use it to show itself (``repr``, ``_repr_html_``).
"""
