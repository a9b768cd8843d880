"""One rank of ``test_sidecar_trust.test_rank0_verifies_others_hit_the_cache`` (torchrun, gloo):
builds train/valid/test through ``BlendedMegatronDatasetBuilder`` and records how many full
verifications this rank ran."""

from __future__ import annotations

import argparse
import json
import os

import torch

from megatron_endprompt.data.sidecar import trust


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prefix", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    calls: list[str] = []
    real_verify, real_fp = trust.verify_sidecar, trust.file_fingerprint
    trust.verify_sidecar = lambda *x: calls.append("verify") or real_verify(*x)
    trust.file_fingerprint = lambda *x: calls.append("sha256") or real_fp(*x)
    config = EndPromptDatasetConfig(
        random_seed=1234, sequence_length=32, blend=([a.prefix], None), split="80,10,10",
        tokenizer=build_megatron_tokenizer("NullTokenizer", None, 1000),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, path_to_cache=a.cache, endprompt_target_length=256)
    train, _, _ = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [20, 4, 4], lambda: True,
                                                config).build()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"calls": calls, "first_sample": train[0]["position_ids"].tolist()}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
