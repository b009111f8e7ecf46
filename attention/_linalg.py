"""Linear algebra shared by the Nyström-type backends (not a backend: the leading underscore keeps
the registry from importing it as one)."""

from __future__ import annotations

import torch


def hyperpower_iterations(a: torch.Tensor, z: torch.Tensor, iterations: int) -> torch.Tensor:
    """Razavi et al.'s order-3 hyper-power iteration towards the (pseudo-)inverse of each (m, m) matrix
    in ``a``, from the start ``z``: Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))). The start must be chosen per
    matrix (Nyströmformer's and Skyformer's public code share one scale across the batch)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z
