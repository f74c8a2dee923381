"""kiln inside torch.distributed: DDP's bucketed backward (ddp.py); FSDP2's hooks stay eager (capture)."""
from kiln.distributed.ddp import compiled_inner_module, split_at_ddp_buckets

__all__ = ["compiled_inner_module", "split_at_ddp_buckets"]
