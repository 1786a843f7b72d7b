"""Per-rank loading measured: the proposed design as written, Megatron's samplers, what an
epoch served, and real ``torch.distributed`` runs (the fix is :mod:`packlab.loading.per_rank`)."""
