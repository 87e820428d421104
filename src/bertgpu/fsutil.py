"""Never leave a half-written output: build a folder under a temporary name, then swap it in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_dir(tmp: Path, final: Path) -> Path:
    """Move the finished folder `tmp` to `final`, replacing an existing `final`.

    The old folder is first renamed aside (`final.old`) and removed only after the new one is in
    place, so at every moment either the old or the new complete folder exists."""
    tmp, final = Path(tmp), Path(final)
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final
