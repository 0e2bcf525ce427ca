"""``--set KEY=VALUE``: how every trainer's command line changes one of its settings.

A setting is a field of the trainer's config dataclass; the value is read as the type of the
field's default, and a wrong key or value is an error naming the settings there are.
"""

from __future__ import annotations

import dataclasses


def override(cfg, text: str, parts: tuple[str, ...] = (), fixed: tuple[str, ...] = ()):
    """``cfg`` with the ``KEY=VALUE`` in ``text`` applied. With ``parts``, ``cfg`` holds
    configs in those fields and KEY names a field of the first of them that has it; ``fixed``
    names fields --set may not change (their own flags set them)."""
    key, sep, value = text.partition("=")
    configs = [(part, getattr(cfg, part)) for part in parts] or [(None, cfg)]
    for part, sub in configs:
        fields = {f.name: f for f in dataclasses.fields(sub)}
        if sep and key in fields and key not in fixed:
            kind = type(fields[key].default)
            try:
                changed = dataclasses.replace(sub, **{key: kind(value)})
            except ValueError:
                raise ValueError(f"{text!r}: {key} must be {kind.__name__}") from None
            return changed if part is None else dataclasses.replace(cfg, **{part: changed})
    names = [f.name for _, sub in configs for f in dataclasses.fields(sub) if f.name not in fixed]
    raise ValueError(f"{text!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
