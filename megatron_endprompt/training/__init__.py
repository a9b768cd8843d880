"""Training path: EndPrompt flags, batches with positions on every rank, weighted loss,
and the providers that plug into ``megatron.training.pretrain``."""
