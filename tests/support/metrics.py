"""Reading a frontend's ``/metrics`` in tests.

Every series of a served model's own state carries ``model="<served name>"``; tests of a
one-model server read a family by its other labels, with :func:`samples`.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, *, model: str | None = None) -> dict[str, float]:
    """``{'{label="value",...}': value}`` of the samples called ``name`` in the exposition ``text``
    (``''`` for a sample without labels). The ``model`` label is left out of the key; given
    ``model``, only that model's samples are read."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            labels = dict(sample.labels)
            served = labels.pop("model", None)
            if model is not None and served != model:
                continue
            key = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
            out[key] = out.get(key, 0.0) + sample.value
    return out
