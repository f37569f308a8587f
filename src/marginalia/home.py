"""Where marginalia keeps its state: model caches now, indexes later."""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "MARGINALIA_HOME"


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the home directory, creating it if needed.

    Order: the explicit argument (the CLI's ``--home``), then ``$MARGINALIA_HOME``,
    then the user's data directory (e.g. ``~/.local/share/marginalia``).
    """
    if explicit:
        home = Path(explicit)
    elif os.environ.get(ENV_HOME):
        home = Path(os.environ[ENV_HOME])
    else:
        import platformdirs

        home = Path(platformdirs.user_data_dir("marginalia", appauthor=False))
    home = home.expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home
