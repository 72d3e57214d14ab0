"""DDP gradients summed in an order a resumed process repeats: the bit-exact half of a DDP resume.

DDP all-reduces gradients in flat buckets, and a ring all-reduce adds each element's per-rank values in
an order that depends on where the element lies in the bucket. A process's first backward uses buckets
in parameter order; DDP then rebuilds them in the order the gradients arrived and keeps those. So an
uninterrupted run sums step N's gradients in rebuilt buckets while a run resumed at step N sums them in
the first layout: at 3 ranks or more ``(a + b) + c`` differs from ``a + (b + c)`` in the last bits, and
the runs drift apart (at 2 ranks ``a + b == b + a``, which is why 2 ranks resumed exactly all along).

``reduce_each_parameter`` all-reduces every parameter's gradient on its own, so where it sits in a
bucket no longer matters: each element is summed in an order fixed by its parameter's shape and the
world size, the same in every process of the run. It issues one collective per parameter instead of
one per bucket, which costs latency on models with many small parameters.

    model = DistributedDataParallel(module)
    model.register_comm_hook(None, reduce_each_parameter)
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations against the real types.
import torch
import torch.distributed as dist


def reduce_each_parameter(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket's gradients averaged over ``process_group`` (the default
    group when None) with one all-reduce per parameter, in the bucket's parameter order (the same on
    every rank, as DDP requires of the hooks' collectives)."""
    group = process_group if process_group is not None else dist.group.WORLD
    flat = bucket.buffer()
    gradients = _views_of(flat, bucket.gradients())
    flat.div_(dist.get_world_size(group))  # before the sum, as DDP's own hook: no overflow in half precision
    works = [dist.all_reduce(gradient, group=group, async_op=True) for gradient in gradients]
    return torch.futures.collect_all([work.get_future() for work in works]).then(lambda _: flat)


def _views_of(flat: torch.Tensor, gradients: list[torch.Tensor]) -> list[torch.Tensor]:
    """``gradients``, checked to be views into ``flat``: reduced in place, they are what DDP reads back.
    A torch whose buckets handed out copies would train on unreduced gradients without a word."""
    storage = flat.untyped_storage().data_ptr()
    if any(gradient.untyped_storage().data_ptr() != storage for gradient in gradients):
        raise RuntimeError(
            "GradBucket.gradients() are not views of the bucket: reduce_each_parameter needs them"
        )
    return gradients
