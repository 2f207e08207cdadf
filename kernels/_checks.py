"""Argument checks shared by the wrappers and references: each error names the argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch

ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    value: object,
    *,
    ndim: int,
    dtypes: Sequence[torch.dtype],
) -> torch.Tensor:
    """Raise TypeError unless `value` is a tensor of one of `dtypes`, ValueError unless `ndim` dims."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {value.dtype}")
    if value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(value.shape)}")
    return value


def check_size(name: str, tensor: torch.Tensor, dim: int, expected: int, what: str) -> None:
    """Raise ValueError unless tensor.shape[dim] == expected; `what` says where expected came from."""
    if tensor.shape[dim] != expected:
        raise ValueError(
            f"{name}.shape[{dim}] must be {expected} ({what}), got shape {tuple(tensor.shape)}"
        )


def check_same_device(names_and_tensors: Sequence[tuple[str, torch.Tensor]]) -> torch.device:
    """Raise ValueError unless all tensors share the first one's device; return that device."""
    first_name, first = names_and_tensors[0]
    for name, tensor in names_and_tensors[1:]:
        if tensor.device != first.device:
            raise ValueError(
                f"{name} is on {tensor.device} but {first_name} is on {first.device}"
            )
    return first.device


def check_same_dtype(names_and_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Raise TypeError unless all tensors share the first one's dtype."""
    first_name, first = names_and_tensors[0]
    for name, tensor in names_and_tensors[1:]:
        if tensor.dtype != first.dtype:
            raise TypeError(f"{name} is {tensor.dtype} but {first_name} is {first.dtype}")


def check_unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError unless the last dim is contiguous (what the Triton kernels index by)."""
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} must have stride 1 in its last dim, got strides {tuple(tensor.stride())}"
        )


def check_contiguous(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError unless `tensor` is contiguous."""
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous, got shape {tuple(tensor.shape)} "
            f"strides {tuple(tensor.stride())}"
        )


def check_positive_float(name: str, value: object) -> float:
    """Raise TypeError unless `value` is a real number, ValueError unless it is > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)
