"""The built-in catalogue of model architectures: one `config.json` copy per entry.

Each `<entry>.json` is a model's config.json plus private `_`-prefixed keys (`_names`: the
hub ids it answers to). The planner counts parameters from it; the trainer builds the
built-in models (`builtin://...`) from it. Both read it through here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATALOGUE_DIR = Path(__file__).parent


def read_entry(name: str, *, private: bool = False) -> dict[str, Any]:
    """The entry `name` (a file stem); without the private `_` keys unless asked for."""
    data: dict[str, Any] = json.loads((CATALOGUE_DIR / f"{name}.json").read_text())
    return data if private else {k: v for k, v in data.items() if not k.startswith("_")}
