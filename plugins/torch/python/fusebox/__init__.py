"""fusebox: gradient bucketing and tuned allreduce for data-parallel training.

The PyTorch entry point is ``fusebox.torch.register(ddp_model)``.
"""
