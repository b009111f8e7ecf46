"""Attention backends for the LRA harness (depends on torch only).

>>> import attention
>>> attention.available()[:3]
['bigbird', 'informer', 'informer_mask']
>>> attn = attention.build("softmax", num_heads=2, head_dim=32, max_len=2048, dropout=0.0)
>>> out = attn(q, k, v, mask)   # (batch, heads, n, head_dim); mask bool (batch, n), True = real

Every module in this package that does not start with "_" is imported on first use and registers
its backends with :func:`attention.registry.register`; a new method family is a new file.
"""

from attention.registry import (
    AttentionBackend,
    BackendContractError,
    Capabilities,
    DuplicateBackend,
    ExternalImportError,
    InvalidOption,
    NoOptions,
    available,
    build,
    capabilities,
    check_choice,
    check_range,
    describe,
    full_mask,
    import_contained,
    list_backends,
    load_external,
    make_options,
    option_defaults,
    option_info,
    options_class,
    register,
)

__all__ = [
    "AttentionBackend",
    "BackendContractError",
    "Capabilities",
    "DuplicateBackend",
    "ExternalImportError",
    "InvalidOption",
    "NoOptions",
    "available",
    "build",
    "capabilities",
    "check_choice",
    "check_range",
    "describe",
    "full_mask",
    "import_contained",
    "list_backends",
    "load_external",
    "make_options",
    "option_defaults",
    "option_info",
    "options_class",
    "register",
]
