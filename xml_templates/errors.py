"""The one exception of xml_templates: a domain or device that cannot be built as asked.

It is a ValueError, so callers that already catch ValueError keep working; its message is the one line the
user sees (the CLI prints it and exits 2), so it says what to change.
"""
from __future__ import annotations


class DomainXmlError(ValueError):
    """Options or XML that make no valid Orion domain; the message tells the user what to change."""
