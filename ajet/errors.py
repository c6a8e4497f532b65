"""The base of errors a user can fix (bad config, data, workflow, model path).

The CLI prints them as one message without a traceback and exits with code 2.
"""

from __future__ import annotations


class AjetUserError(Exception):
    """Bad input: the message names the place and the fix."""
