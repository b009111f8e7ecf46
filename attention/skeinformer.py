"""Skeinformer (Chen, Zeng et al., "Sketching as a Tool for Understanding and Accelerating
Self-attention for Long Sequences", NAACL 2022; arXiv 2112.05359): Algorithm 1 and its ablations.

Notation of the paper: Q, K, V are n×p (p = head dim), d is the sub-sample size ("number of
features", option ``num_features``, 256 in the paper), A = exp(QKᵀ/√p), D = diag(A1), B = D⁻¹A.
For every (sample, head):

1. **pilot sampling**: d query rows J drawn uniformly among the real tokens; B_J = softmax(Q_J Kᵀ/√p)
   over the real keys (exact rows of B).
2. **column importance sampling** (eq. 5): p̂_i ∝ ‖(B_J)^(i)‖₂ · ‖V_(i)‖₂ over real keys i (padded
   keys get probability 0, §4.4); d columns J' drawn WITHOUT replacement with these probabilities.
3. **adaptive row normalisation** (eq. 6): in each row the m − d unselected entries of A are filled
   with g_i = (∏_{j∈J'} a_ij)^{1/d}, the geometric mean of the selected ones, so
   d̂_i = Σ_{J'} a_ij + (m − d) g_i and R = diag(d̂)⁻¹ (A^{J'} V_{J'} + g vᵀ), v = Σ_{unselected real} V_(j).
4. **pilot sampling reutilisation**: the rows J of R are replaced by their exact output B_J V.

Here m is the number of real tokens of the sample (per-sample counts; padding may sit anywhere) and
d = min(num_features, m) per sample. Complexity O(n·d·p) time and O(n·d) memory (the paper takes
d = O(log n), hence its O(n log n)); the ``row_norm="exact"`` ablation is O(n²).

Budget ≥ n: column sampling without replacement then selects every real key, so the fill term
(m − d)g vanishes and d̂ is the exact row sum D: the output equals softmax attention up to float
rounding, for every variant below (and with the default pilot sampling without replacement every
real row is also a pilot row, i.e. exact twice over).

Registered names (one class, other option defaults; the paper's Table 1 ablation rows):
  * ``skeinformer``: Algorithm 1.
  * ``skeinformer_uniform`` ("w/ uniform sampling"): J' uniform over real keys. As in the public
    code the pilot is then not computed at all (``pilot_reuse=False``): no probabilities need it,
    and this is what the paper's timing/memory rows for this ablation measure.
  * ``skeinformer_no_rownorm`` ("w/o row normalization", ``row_norm="exact"``): the plain sketch of
    §4.1, D⁻¹ A S Sᵀ V with the exact D (O(n²), like the paper's memory-hungry row). S is the
    without-replacement sample J' with Horvitz-Thompson weights 1/π_j, π_j the inclusion probability
    conditioned on the (d+1)-th largest Gumbel key κ (π_j = 1 − exp(−p̂_j e^{−κ}), priority-sampling
    style), so the estimate of AV is unbiased and exact when d ≥ m.
  * ``skeinformer_simple_rownorm`` ("w/ simple row normalization", ``row_norm="simple"``): softmax
    over the selected columns only, softmax(Q K_{J'}ᵀ/√p) V_{J'} (Informer's normalisation).
  * ``skeinformer_no_pilot`` ("w/o pilot sampling reutilization", ``pilot_reuse=False``).

Deviations from the paper / its public code, and why (defaults; each has an option below):
  * pilot rows are drawn WITHOUT replacement by default (Algorithm 1 says with replacement;
    ``pilot_sampling="with_replacement"`` restores it). Distinct pilots give d exact rows instead of
    ≈ m(1 − e^{−d/m}), make budget ≥ m exact row by row, and avoid double-counted gradients of
    duplicated pilot rows (with replacement, only the first copy of a row is reused).
  * sampling is per sample and per head among real positions via Gumbel-top-k (same law as
    ``torch.multinomial(replacement=False)``), so padding may sit anywhere and each sample keeps its
    own d = min(num_features, m); samples of a batch do not influence each other.
  * scores are stabilised by subtracting the row max of the selected scores (the public code
    exponentiates raw scores, which overflows in fp32 once a score exceeds ~88); this cancels exactly
    in eq. 6, so it has no option.
  * w/o row normalisation uses the importance-weighted sketch of §4.1 (unbiased) rather than the
    public code's unweighted Σ_{J'} a_ij v_j / D_i, which shrinks outputs by about d/m.
  * randomness is redrawn on every call (the sampling probabilities depend on the data, so a fixed
    draw is not meaningful); ``torch.manual_seed`` before a call fixes it.

Public-code semantics (``paper`` presets). The public code is https://github.com/pkuzengqi/Skeinformer,
``src/models/attention_skeinformer.py``: ``SkeinAttention`` (Algorithm 1) and the ablation classes
``SkeinAttention_ablation_uniform`` / ``_no_normalization`` / ``_simple_normalization`` / ``_nopilot``
(selected as ``skeinformer`` / ``skein_uniform`` / ``skein_nonorm`` / ``skein_simplenorm`` /
``skein_nopilot`` in ``src/models/attention.py``). Each quirk is an option; the default is the
corrected behaviour above:
  * ``pilot_sampling="with_replacement"``: ``uniform_sketching`` draws d independent uniform rows.
  * ``pilot_heads="shared"``: one set of pilot rows per sample, gathered for every head (S0 has a
    single "m" axis, no head axis).
  * ``pilot_batch="shared"``: ``uniform_sketching`` draws ONE vector u of d uniforms (``torch.rand``)
    for the batch and sample i takes rows ⌊u·m_i⌋ (float32 product, truncated): draws are coupled
    across samples. Needs ``pilot_sampling="with_replacement"``.
  * ``draw_from="prefix"``: those rows lie in [0, m_i) of the padded sequence (right padding assumed);
    with padding elsewhere (e.g. pixel-0 masks) a pilot may land on a padded position, whose query
    the public code has zeroed: its B_J row is uniform over the real keys, it enters the column
    probabilities, and it overwrites only that padded row. Identical to ``"real"`` for right padding.
  * ``budget="batch_shortest"``: d = min(num_features, min_i m_i − 1) for the WHOLE batch (the public
    code reads it with ``.item()``, a host sync). Here d is a tensor: min(num_features, n − 1) slots,
    the first d valid (the first k Gumbel-top-k picks are a without-replacement k-sample), so there is
    no sync and no recompile; d is clamped to ≥ 1 (the public code fails on a 1-token sample).
  * ``sketch_weights="none"`` (with ``row_norm="exact"``): ``_no_normalization`` divides the unweighted
    Σ_{J'} a_ij v_j by the exact row sum D_i.
  * ``pilot_duplicate_grad="per_copy"``: pilot reuse is an index assignment, so a row drawn c times
    gets the same (exact) value but c times its gradient; here the forward is unchanged and each copy
    passes the full gradient.
  * ablations: ``_simple_normalization`` and ``_no_normalization`` compute the pilot for the column
    probabilities but do NOT reuse it (``pilot_reuse=False``); ``_uniform`` computes no pilot.
  * the column draw is per (sample, head), without replacement (``torch.multinomial``), the same law
    as ``gumbel_topk``; duplicated pilot rows count once per copy in eq. (5) in both. Outputs at padded
    query rows differ (the public code zeroes padded queries); they never reach a real token.
The V-mean baseline (1/m 11ᵀV) lives in ``attention/vmean.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attention._scores import flat_scores, key_bias, scores
from attention.registry import (
    AttentionBackend,
    Capabilities,
    InvalidOption,
    check_choice,
    check_range,
    full_mask,
    register,
)
from attention.softmax import key_mask

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SkeinformerOptions:
    num_features: int = 256  # d: pilot rows and sampled columns per (sample, head)
    column_sampling: str = "importance"  # "importance" (eq. 5) | "uniform"
    row_norm: str = "adaptive"  # "adaptive" (eq. 6) | "simple" (softmax over J') | "exact" (D⁻¹ASSᵀV)
    pilot_reuse: bool = True  # replace the pilot rows by their exact output B_J V
    pilot_sampling: str = "without_replacement"  # | "with_replacement" (Algorithm 1 as printed)
    pilot_heads: str = "per_head"  # pilot rows drawn per head | "shared": one draw for all heads of a sample
    pilot_batch: str = "independent"  # per sample | "shared": one u ~ U[0,1)^d for the batch, rows ⌊u·m_i⌋
    draw_from: str = "real"  # pilot rows among real tokens | "prefix": positions [0, m_i) (right padding assumed)
    budget: str = "per_sample"  # d = min(num_features, m_i) | "batch_shortest": min(num_features, min_i m_i − 1)
    sketch_weights: str = "horvitz_thompson"  # row_norm="exact": weights 1/π_j | "none": Σ_{J'} a_ij v_j / D_i
    pilot_duplicate_grad: str = "once"  # pilot row drawn c times: gradient once | "per_copy": c times

    def __post_init__(self):
        check_range("num_features", self.num_features, 1, None, integer=True)
        check_choice("column_sampling", self.column_sampling, ("importance", "uniform"))
        check_choice("row_norm", self.row_norm, ("adaptive", "simple", "exact"))
        check_choice("pilot_reuse", self.pilot_reuse, (True, False))
        check_choice("pilot_sampling", self.pilot_sampling, ("without_replacement", "with_replacement"))
        check_choice("pilot_heads", self.pilot_heads, ("per_head", "shared"))
        check_choice("pilot_batch", self.pilot_batch, ("independent", "shared"))
        check_choice("draw_from", self.draw_from, ("real", "prefix"))
        check_choice("budget", self.budget, ("per_sample", "batch_shortest"))
        check_choice("sketch_weights", self.sketch_weights, ("horvitz_thompson", "none"))
        check_choice("pilot_duplicate_grad", self.pilot_duplicate_grad, ("once", "per_copy"))
        if self.pilot_batch == "shared" and self.pilot_sampling != "with_replacement":
            raise InvalidOption(
                "option 'pilot_batch'='shared' needs pilot_sampling='with_replacement' "
                "(independent uniform positions, as in the public code)"
            )


# ---------------------------------------------------------------- sampling (module level so tests can inject)
def gumbel_topk(log_w: torch.Tensor, d: int, kth: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``d`` indices along the last dim without replacement, P ∝ exp(log_w) (Gumbel-top-k).

    Entries with ``log_w = -inf`` (padding) come last, so they are picked only when fewer than ``d``
    entries are finite. Returns ``(idx, kappa)``: idx (..., d), in decreasing order of the perturbed
    keys (so its first k entries are a without-replacement sample of size k), and kappa (..., 1), the
    (kth+1)-th largest perturbed key (kth a 0-dim tensor ≤ d, default d), ``-inf`` when there is none;
    kappa drives the inclusion probabilities of ``row_norm="exact"``.
    """
    u = torch.rand(log_w.shape, dtype=log_w.dtype, device=log_w.device)
    keys = log_w - torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    n = log_w.shape[-1]
    if n > d:
        vals, idx = keys.topk(d + 1, dim=-1)
        if kth is None:
            return idx[..., :d], vals[..., d:]
        return idx[..., :d], vals.gather(-1, kth.reshape([1] * vals.dim()).expand(*vals.shape[:-1], 1))
    idx = keys.topk(d, dim=-1).indices
    return idx, torch.full_like(keys[..., :1], NEG_INF)


def sample_pilot_rows(real: torch.Tensor, d: int, replacement: bool) -> torch.Tensor:
    """Uniform pilot rows J among the allowed positions: real (b, h, n) bool -> (b, h, d) indices.

    ``h`` may be 1 (pilot rows shared by the heads). Without replacement, disallowed positions come
    last (only when fewer than ``d`` are allowed)."""
    b, h, n = real.shape
    if replacement:
        w = real.reshape(b * h, n).to(torch.float32)
        return torch.multinomial(w, d, replacement=True).view(b, h, d)
    log_w = torch.zeros(real.shape, dtype=torch.float32, device=real.device).masked_fill(~real, NEG_INF)
    return gumbel_topk(log_w, d)[0]


def pilot_uniforms(shape: tuple, device) -> torch.Tensor:
    """The uniforms u ∈ [0, 1) behind ``pilot_batch="shared"`` (float32, like the public code's draw)."""
    return torch.rand(shape, dtype=torch.float32, device=device)


def nth_allowed(allowed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row ⌊u·c⌋ of the allowed positions in increasing order, c = their count (with replacement).

    allowed (B, H, n) bool; u (1 or B, 1 or H, d) uniforms -> (B, H, d) positions. With a prefix
    mask (``draw_from="prefix"``) this is the position ⌊u·m_i⌋ itself, the public code's pilot row.
    The product u·c is taken in u's dtype (float32) and truncated, as there.
    """
    count = allowed.sum(-1, keepdim=True)  # (B, H, 1)
    kth = (u * count.to(u.dtype)).floor().long()
    kth = torch.minimum(kth, count - 1).clamp_min(0)
    order = torch.sort((~allowed).to(torch.uint8), dim=-1, stable=True).indices  # allowed positions first
    return order.gather(-1, kth.expand(*allowed.shape[:-1], u.shape[-1]))


def column_log_weights(
    b_pilot: torch.Tensor, pilot_valid: torch.Tensor, v: torch.Tensor, real: torch.Tensor
) -> torch.Tensor:
    """log of eq. (5)'s p̂_i ∝ ‖(B_J)^(i)‖ ‖V_(i)‖ (unnormalised), -inf on padded keys.

    b_pilot (b, h, d, n) pilot rows of B; pilot_valid (b, h, d) which pilots count; v (b, h, n, p);
    real (b, h, n).
    """
    col = (pilot_valid.to(b_pilot.dtype)[..., None, :] @ b_pilot.square()).squeeze(-2).sqrt()  # Σ over valid pilots
    w = col * v.norm(dim=-1)
    w = w.masked_fill(~real, 0.0)
    w = w / w.amax(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    # real keys with a zero weight stay selectable (ahead of padding) but last
    return w.clamp_min(1e-30).log().masked_fill(~real, NEG_INF)


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (b, h, n, p), idx (b, h, d) -> (b, h, d, p)."""
    return x.gather(2, idx[..., None].expand(*idx.shape, x.shape[-1]))


@register("skeinformer", doc="Skeinformer (Algorithm 1): column importance sampling + adaptive row norm + pilot reuse")
@register(
    "skeinformer_uniform",
    defaults={"column_sampling": "uniform", "pilot_reuse": False},
    doc="Skeinformer ablation: uniform column sampling (no pilot)",
)
@register(
    "skeinformer_no_rownorm",
    defaults={"row_norm": "exact"},
    doc="Skeinformer ablation: no row normalisation (sketch D⁻¹ASSᵀV with the exact D, O(n²))",
    capabilities=Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n^2)",
        notes="the exact row sums D cost O(n^2), as the paper's row",
    ),
)
@register(
    "skeinformer_simple_rownorm",
    defaults={"row_norm": "simple"},
    doc="Skeinformer ablation: simple row normalisation (softmax over the sampled columns)",
)
@register(
    "skeinformer_no_pilot", defaults={"pilot_reuse": False}, doc="Skeinformer ablation: no pilot sampling reutilisation"
)
class SkeinformerAttention(AttentionBackend):
    """Skeinformer sketching attention (Algorithm 1) and its ablations."""

    Options = SkeinformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n d)",
        notes="exact when num_features >= real tokens; row_norm='exact' is O(n^2)",
    )

    def _pilot_rows(self, real: torch.Tensor, m: torch.Tensor, h: int, d: int) -> torch.Tensor:
        """Pilot row indices (b, h, d) per the options; real (b, n), m (b,) real counts."""
        o = self.options
        b, n = real.shape
        if o.draw_from == "real":
            allowed = real
        else:  # the first m_i positions of the padded sequence, wherever the padding is
            allowed = torch.arange(n, device=real.device)[None, :] < m[:, None]
        hh = 1 if o.pilot_heads == "shared" else h
        allowed = allowed[:, None, :].expand(b, hh, n)
        if o.pilot_batch == "shared":
            pilot = nth_allowed(allowed, pilot_uniforms((1, hh, d), real.device))
        else:
            pilot = sample_pilot_rows(allowed, d, o.pilot_sampling == "with_replacement")
        return pilot.expand(b, h, d)

    def forward(self, q, k, v, mask=None):
        o = self.options
        b, h, n, p = q.shape
        real = key_mask(full_mask(q, mask))  # (b, n); an all-padding sample uses every position
        m = real.sum(-1)  # real tokens per sample
        realh = real[:, None, :].expand(b, h, n)
        keyreal = real[:, None, None, :]  # broadcasts over (b, h, rows, n)
        v = v.masked_fill(~real[:, None, :, None], 0.0)
        scale = p**-0.5
        if o.budget == "per_sample":  # d slots, a sample with m < d fills the rest with (invalid) padding
            d, d_eff, slot = min(o.num_features, n), None, None
        else:  # one d for the batch, as a tensor: fixed slots, the first d_eff valid (no host sync)
            d = min(o.num_features, max(n - 1, 1))
            d_eff = (m.min() - 1).clamp(1, o.num_features)  # the public code fails at 0 (a 1-token sample)
            slot = torch.arange(d, device=q.device) < d_eff  # (d,)

        # 1. pilot sampling: exact rows B_J of the attention matrix
        use_pilot = o.pilot_reuse or o.column_sampling == "importance"
        if use_pilot:
            with torch.no_grad():
                pilot = self._pilot_rows(real, m, h, d)
                pilot_real = realh.gather(2, pilot)  # may be False: m < d, or draw_from="prefix"
                if o.draw_from == "real":
                    pilot_valid = pilot_real
                else:  # a padded pilot row counts, with its query zeroed (uniform over the real keys)
                    pilot_valid = (
                        (torch.arange(n, device=q.device)[None, :] < m[:, None])[:, None, :]
                        .expand(b, h, n)
                        .gather(2, pilot)
                    )
                if slot is not None:
                    pilot_valid, pilot_real = pilot_valid & slot, pilot_real & slot
            with torch.set_grad_enabled(torch.is_grad_enabled() and o.pilot_reuse):  # else only probabilities
                q_j = _gather_rows(q, pilot) * pilot_real[..., None]
                b_pilot = scores(q_j, k, scale, key_bias(keyreal, q.dtype)).softmax(-1)  # (b, h, d, n)

        # 2. column sampling J' (no gradient through the discrete draw)
        with torch.no_grad():
            if o.column_sampling == "importance":
                log_w = column_log_weights(b_pilot.detach(), pilot_valid, v.detach(), realh)
            else:
                log_w = torch.zeros(b, h, n, dtype=q.dtype, device=q.device).masked_fill(~realh, NEG_INF)
            cols, kappa = gumbel_topk(log_w, d) if slot is None else gumbel_topk(log_w, d, d_eff)
            col_valid = realh.gather(2, cols)  # False where the sample has fewer than d real keys
            if slot is not None:
                col_valid = col_valid & slot
        k_s, v_s = _gather_rows(k, cols), _gather_rows(v, cols)
        if o.row_norm == "simple":
            s = scores(q, k_s, scale, key_bias(col_valid[:, :, None, :], q.dtype))  # (b,h,n,d), -inf off J'

        # 3. row normalisation
        if o.row_norm == "adaptive":  # eq. (6), on (b·h, n, d) matrices: the GEMM's output, changed in place
            s = flat_scores(q, k_s, scale, key_bias(col_valid[:, :, None, :], q.dtype))  # -inf off J'
            c = s.amax(-1, keepdim=True).detach()
            e = s.sub_(c).exp_()  # a_ij / e^{c_i} on J', 0 on invalid columns
            c = c.view(b, h, n, 1)
            valid = col_valid.to(q.dtype)[..., None]  # (b,h,d,1)
            d_real = valid.sum(-2, keepdim=True)  # selected real columns (b,h,1,1)
            # Σ_{J'} log a_ij = q_i · Σ_{J'} k_j · scale: one matrix-vector product, not a pass over (n, d)
            log_g = (q @ (k_s * valid).sum(-2)[..., None]) * scale / d_real
            g = torch.exp(log_g - c)  # geometric mean of the selected a_ij, over e^{c_i}
            n_rest = m.to(q.dtype)[:, None, None, None] - d_real  # unselected real columns, m - d
            # the draw is without replacement, so the selected real values are distinct rows of v
            v_rest = v.sum(-2, keepdim=True) - (v_s * valid).sum(-2, keepdim=True)  # (b,h,1,p)
            # Σ_{J'} e_ij rides as a column of ones beside V_{J'}: one GEMM gives numerator and row sum, and e
            # gets one gradient (a separate e.sum would add a second (n, d) gradient into it)
            both = torch.bmm(e, torch.cat([v_s, torch.ones_like(v_s[..., :1])], dim=-1).view(b * h, -1, p + 1))
            both = both.view(b, h, n, p + 1)
            out = (both[..., :-1] + g * v_rest) / (both[..., -1:] + n_rest * g)
        elif o.row_norm == "simple":
            out = s.softmax(-1) @ v_s
        else:  # "exact": D⁻¹ A S Sᵀ V, Horvitz-Thompson weights of the without-replacement sample or none
            # a_ij / D_i with the exact D_i are entries of the softmax of the full rows: one fused pass, where
            # exp(s - logsumexp) took five over the n x n matrix and three more backward
            probs = scores(q, k, scale, key_bias(keyreal, q.dtype)).softmax(-1)
            a_s = probs.gather(-1, cols[:, :, None, :].expand(b, h, n, d)) * col_valid[:, :, None, :]
            if o.sketch_weights == "horvitz_thompson":
                with torch.no_grad():
                    incl = -torch.expm1(-torch.exp(log_w.gather(2, cols) - kappa))  # P(key_j > kappa)
                    incl = torch.where(col_valid & (kappa > NEG_INF), incl, torch.ones_like(incl)).clamp_min(1e-6)
                a_s = a_s / incl[:, :, None, :]
            out = a_s @ v_s

        # 4. pilot sampling reutilisation: pilot rows get their exact output B_J V
        if o.pilot_reuse:
            ok = pilot_real  # real pilot rows in valid slots
            exact = b_pilot @ v  # (b, h, d, p)
            if o.pilot_sampling == "with_replacement":  # duplicates adjacent, invalid slots last
                key = torch.where(ok, pilot, n + torch.arange(d, device=q.device))
                key, order = key.sort(-1)
                pilot, ok = pilot.gather(2, order), ok.gather(2, order)
                exact = exact.gather(2, order[..., None].expand_as(exact))
                first = ok.clone()
                first[..., 1:] &= key[..., 1:] != key[..., :-1]
            else:
                first = ok
            w = first.to(q.dtype)[..., None]
            if o.pilot_duplicate_grad == "per_copy":  # value of one copy, the gradient of every copy
                contrib = exact.detach() * w + (exact - exact.detach()) * ok.to(q.dtype)[..., None]
            else:
                contrib = exact * w
            idx = pilot[..., None].expand(b, h, d, p)
            exact_full = torch.zeros_like(out).scatter_add(2, idx, contrib)
            is_pilot = torch.zeros(b, h, n, dtype=q.dtype, device=q.device).scatter_add(2, pilot, w[..., 0]) > 0
            out = torch.where(is_pilot[..., None], exact_full, out)
        return out
