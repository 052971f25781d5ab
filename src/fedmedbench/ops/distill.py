"""Knowledge-distillation terms and PRR-FL's Deputy-Enhanced Transfer stage machine.

- ``kl_to_teacher(student_logits, teacher_logits)``: ``KL(p_teacher || p_student)`` at temperature 1,
  the teacher **detached** (a constant target: the gradient reaches only the student). For logits
  ``(B, C)`` it is ``F.kl_div(log_softmax(student), softmax(teacher), reduction="batchmean")``, what
  PRR-FL's ``DET`` and deep mutual learning use; for dense logits ``(B, C, *spatial)`` the KL is taken
  per pixel over the class axis and averaged over batch and pixels (FML on segmentation).
- ``det_stage(previous, phi_deputy, phi_personal, ...)``: which DET stage the next local epoch runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NO_STAGE, RECOVER, EXCHANGE, SUBLIMATE = 0, 1, 2, 3
STAGE_NAMES = {RECOVER: "recover", EXCHANGE: "exchange", SUBLIMATE: "sublimate"}


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(teacher) || softmax(student))``, teacher detached, mean over samples (and pixels)."""
    log_student = F.log_softmax(student_logits.float(), dim=1)
    teacher = F.softmax(teacher_logits.detach().float(), dim=1)
    pointwise = F.kl_div(log_student, teacher, reduction="none").sum(dim=1)  # (B, *spatial)
    return pointwise.mean()


def det_stage(
    previous: int,
    phi_deputy: float | None,
    phi_personal: float | None,
    recover_threshold: float = 0.7,
    sublimate_threshold: float = 0.9,
) -> int:
    """The DET stage of the next local epoch (PRR-FL Sec. 2.3; the official ``DET`` rules).

    ``previous``: the stage of the last epoch (``NO_STAGE`` = none yet, e.g. after a reset).
    - no stage yet, or ``phi_d < λ1 phi_p`` -> Recover (the personalized model teaches the deputy);
    - previous Recover and ``phi_d >= λ1 phi_p``, or previous Exchange/Sublimate and ``phi_d < λ2 phi_p``
      -> Exchange (mutual learning);
    - previous Exchange/Sublimate and ``phi_d >= λ2 phi_p`` -> Sublimate (the deputy teaches).
    So Recover -> Sublimate takes at least two epochs. ``phi`` is not read when ``previous`` is ``NO_STAGE``.
    """
    if previous == NO_STAGE or phi_deputy < recover_threshold * phi_personal:
        return RECOVER
    if previous == RECOVER:
        return EXCHANGE
    return SUBLIMATE if phi_deputy >= sublimate_threshold * phi_personal else EXCHANGE


__all__ = ["NO_STAGE", "RECOVER", "EXCHANGE", "SUBLIMATE", "STAGE_NAMES", "kl_to_teacher", "det_stage"]
