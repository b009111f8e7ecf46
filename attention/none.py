"""No token mixing: the "none" row of the YOSO and Nyströmformer LRA tables.

The attention output is V itself (each token sees only itself), which measures how much a task
can be solved without any interaction between positions. O(n) time and memory; trivially
padding-invariant.
"""

from __future__ import annotations

from attention.registry import AttentionBackend, Capabilities, register


@register("none")
class NoAttention(AttentionBackend):
    """Identity mixing: returns V."""

    capabilities = Capabilities(
        padding_mask=True, causal=True, exact=True, complexity="O(n)", target="identity", uses_qk=False
    )

    def forward(self, q, k, v, mask=None):
        return v
