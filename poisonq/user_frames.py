"""Where a failure's traceback starts: at the user's code, poisonq's own frames cut.

Its own module, apart from :mod:`poisonq.failures`, because the crash guard's children take
their failures down with it (:mod:`poisonq.worker.raised`), and the guard's helper must not
load what :mod:`poisonq.failures` imports: :mod:`poisonq.model` loads ``threading``, whose
fork handler runs Python code in every child the helper forks.
"""

from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def from_user_frames(exc: BaseException) -> BaseException:
    """``exc`` with the leading frames of poisonq's own code (the Processor, the crash
    guard) cut from its traceback, so that a failure's history starts where the user's
    code was called. An error raised in poisonq alone keeps every frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return exc if tb is None else exc.with_traceback(tb)
