"""The memo layer of the admin's policy over the models (`AdmitMemo`): which
models `plan.admitted` admits, kept while the models section, the policy and
the Secrets' labels are the same; each model's refusals (`tenancy.refusals`)
keyed on the model object, the policy and the labels; the models that did not
parse, once per models section. Pure; tests/controller/test_pass_incremental.py holds
a pass with it equal to one without.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from localmodel.api import LocalModel
from localmodel.controller.model_work import ModelWork
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed
from localmodel.controller.since import Since
from localmodel.tenancy import Refusal, SecretLabels, TenantPolicy, refusals

Admitted = tuple[list[LocalModel], list[ModelWork]]  # `plan.admitted`: admitted, refused


@dataclass
class AdmitMemo:
    """Keeps the last verdicts of the admin's policy and the models that did not
    parse, keyed on the models section, the policy and the Secrets' labels
    (each model by its object)."""

    since: Since
    refused: dict[str, tuple[LocalModel, TenantPolicy, dict[Any, Any], Any]] = field(
        default_factory=dict)
    # The last `admitted`: the models section, policy, Secrets' labels, those
    # admitted, those refused, and each admitted model's position.
    admits: tuple[Any, Any, dict[Any, Any], list[LocalModel], tuple[LocalModel, ...],
                  dict[str, int]] | None = None
    admits_before: bool = False  # whether `admits` was of the last pass's models
    unparsed: tuple[dict[str, ModelObject], list[ModelObject]] | None = None  # (`invalid`)

    def begin(self, before: Observed | None) -> None:
        """A new pass, after one on `before` (None: the first)."""
        self.admits_before = (before is not None and self.admits is not None
                              and self.admits[0] is before.models)

    def invalid(self, obs: Observed) -> list[ModelObject]:
        """The models that did not parse (once per models section)."""
        if self.unparsed is None or self.unparsed[0] is not obs.models:
            self.unparsed = (obs.models, [mo for mo in obs.models.values() if mo.model is None])
        return self.unparsed[1]

    def admitted(self, obs: Observed, tenants: TenantPolicy, secrets: SecretLabels,
                 admit: Callable[[Sequence[LocalModel] | None], Admitted]) -> Admitted:
        """`plan.admitted` (`admit`: of these models, None: of all), kept while
        the models, the policy and the Secrets' labels are the same: then only the
        models it refused are asked again (their status may take the clock)."""
        last = self.admits
        if (last is not None and (last[1] is tenants or last[1] == tenants)
                and last[2] == secrets):
            if last[0] is obs.models:
                ok, refused = admit(last[4])
                if not ok:  # (`refusals` is pure: a refused model stays refused)
                    return last[3], refused
            elif (kept := self._admitted_again(obs, last, admit)) is not None:
                return kept
        ok, refused = admit(None)
        self.admits = (obs.models, tenants, dict(secrets), ok,
                       tuple(w.model.model for w in refused if w.model.model is not None),
                       {lm.key: i for i, lm in enumerate(ok)})
        return ok, refused

    def _admitted_again(self, obs: Observed, last: Any,
                        admit: Callable[[Sequence[LocalModel] | None], Admitted]
                        ) -> Admitted | None:
        """`admitted` when a few models changed since the last pass's (the same
        ones in the same order): each changed model asked again, the refused
        ones too; None unless each changed one admitted before is admitted
        again, and none changed was refused (else all are asked: the order of
        the lists follows the models')."""
        if not self.admits_before or self.since.models_changed is None:
            return None
        position: dict[str, int] = last[5]
        refused_before = {lm.key for lm in last[4]}
        again: list[LocalModel] = []
        for key in self.since.models_changed:
            lm = obs.models[key].model
            if key in refused_before or (lm is None) != (key not in position):
                return None  # (refused before, or valid before and not now, or the reverse)
            if lm is not None:
                again.append(lm)
        ok, refused = admit([*again, *last[4]])
        if any(w.model.key in position for w in refused) or any(
                lm.key not in position for lm in ok):
            return None  # (one admitted before refused now, or the reverse)
        admitted = list(last[3])
        for lm in ok:
            admitted[position[lm.key]] = lm
        self.admits = (obs.models, last[1], last[2], admitted, last[4], position)
        return admitted, refused

    def refusals(self, lm: LocalModel, tenants: TenantPolicy, secrets: SecretLabels
                 ) -> tuple[Refusal, ...]:
        """`tenancy.refusals`, kept while the model, the policy and the Secrets'
        labels are the same."""
        kept = self.refused.get(lm.key)
        if (kept is not None and kept[0] is lm and (kept[1] is tenants or kept[1] == tenants)
                and kept[2] == secrets):
            return cast(tuple[Refusal, ...], kept[3])
        found = refusals(lm, tenants, secrets)
        self.refused[lm.key] = (lm, tenants, dict(secrets), found)
        return found

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        for key in [k for k in self.refused if k not in keys]:
            del self.refused[key]
