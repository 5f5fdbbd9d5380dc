"""LoRA adapters: the request type, PEFT checkpoints, the batched delta layers and the
adapter slots of one worker."""
