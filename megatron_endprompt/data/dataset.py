"""``EndPromptGPTDataset``: Megatron-Core's ``GPTDataset`` plus EndPrompt positions and weights.

It is built through ``BlendedMegatronDatasetBuilder`` exactly like ``GPTDataset`` (same
``--data-path`` blends, ``--split``, seed, epochs and index cache) and returns the same keys
and dtypes (``tokens``/``labels`` int64 ``[P]``, ``loss_mask`` float32 ``[P]``,
``position_ids`` int64 ``[P]``, ``attention_mask`` bool ``[1, P, P]`` when asked), so
Megatron's batch broadcast over TP works unchanged, plus one key of ours:
``terminal_mask`` float32 ``[P]``, 1 where the prediction belongs to the terminal
(index ``i >= a - 1``; all 0 for replay samples). The trainer reads the terminal from it
instead of guessing it from position jumps (a ``random`` placement may draw ``T = a``).

Per prefix:

* with a sidecar (``PREFIX.endprompt``, or ``PREFIX.NAME.endprompt`` with
  ``endprompt_sidecar_name``): sample ``i`` is either stored sequence ``i`` (``P + 1``
  tokens) or, for a sidecar over the tokenized documents (``sources``, :mod:`.spans`), pieces
  of the ``.bin`` composed at read time (only samples lying wholly inside the split's
  sequences are used); samples are shuffled per epoch with Megatron's own document shuffle;
  positions, loss weights and ``terminal_mask`` come from the sample's layout record;
* listed in ``endprompt_replay_prefixes`` (short-context "replay" data): plain ``GPTDataset``
  behaviour — documents packed into ``P + 1`` windows, contiguous positions, weight 1. Any
  other prefix without the requested sidecar is refused.

Every prefix's ``.idx`` SHA-256 is part of the index-cache key; it and the sidecar's full
verification are computed once per file identity (:mod:`megatron_endprompt.data.sidecar.trust`).

Samples are assembled by :func:`megatron_endprompt.data.assemble.assemble_sample` (Megatron's
extra-token, EOD and padding conventions, the prompt-terminal exceptions), the function
``endprompt-inspect`` calls too; the batch-padding sample (``idx=None``) has an all-zero
``loss_mask``.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import Split

from megatron_endprompt.data.assemble import (SampleRules, assemble_sample, layout_arrays,
                                              pad_in_data)
from megatron_endprompt.data.sample_index import load_or_build_sample_index, samples_in_split
from megatron_endprompt.data.sidecar.sidecar import (Sidecar, check_belongs_to, open_sidecar,
                                                     sidecar_path)
from megatron_endprompt.data.sidecar.spans import span_reader
from megatron_endprompt.data.tokenize.tokenizer_identity import (TokenizerIdentity,
                                                                 tokenizer_identity)
from megatron_endprompt.errors import UserError
from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.data.sidecar.trust import cache_dir, ensure_verified, idx_fingerprint

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class EndPromptDatasetConfig(GPTDatasetConfig):
    """``GPTDatasetConfig`` plus the training-side EndPrompt settings checked against sidecars."""

    endprompt_target_length: int | None = None
    """``L`` the run trains for; every sidecar must have been built for it (None: no check)."""

    endprompt_loss_weights: LossWeights = field(default_factory=LossWeights)
    """The run's overrides of the sidecar's loss weights (a ``None`` field keeps the sidecar's;
    ``--endprompt-terminal-loss-weight``/``--endprompt-context-loss-weight``). Part of the
    index-cache key."""

    endprompt_sidecar_name: str | None = None
    """Read ``PREFIX.NAME.endprompt`` instead of ``PREFIX.endprompt`` (several layouts per
    corpus; ``--endprompt-sidecar-name``). Part of the index-cache key."""

    endprompt_replay_prefixes: list[str] | None = None
    """Prefixes trained as plain replay data (``GPTDataset`` packing, contiguous positions,
    ``--endprompt-replay-prefixes``). Any other prefix without the requested sidecar is
    refused: no dataset becomes replay by accident."""

    endprompt_tokenizer_identity: TokenizerIdentity | None = None
    """The training tokenizer's identity computed once at start-up (``pretrain``'s sidecar
    check on rank 0); ``None``: computed from ``tokenizer`` when the datasets are built. Not
    part of the index-cache key."""


def _same_prefix(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def find_sidecar(prefix: str, *, seq_length: int, target_length: int | None,
                 name: str | None = None, replay_prefixes: list[str] | tuple = (),
                 reset_positions: bool = False,
                 tokenizer_identity: TokenizerIdentity | None = None) -> Sidecar | None:
    """The prefix's sidecar, checked against its data and the training flags; ``None`` for a
    prefix listed in ``replay_prefixes`` (plain replay). The one place where a sidecar meets
    the training flags: used at start-up by the ``pretrain`` entry and when the datasets are
    built. Cheap (header checksum and values, file sizes, records memory-mapped); the full
    verification is :func:`megatron_endprompt.data.sidecar.trust.ensure_verified`. Raises
    :class:`UserError` naming both files/flags on any mismatch."""
    if any(_same_prefix(prefix, r) for r in replay_prefixes or ()):
        return None
    path = sidecar_path(prefix, name)
    if not os.path.exists(path):
        have = sorted(os.path.basename(p) for p in glob.glob(glob.escape(prefix) + "*.endprompt"))
        listed = f" (sidecars there: {', '.join(have)})" if have else ""
        raise UserError(
            f"{prefix}: no EndPrompt sidecar {path}{listed}; build it "
            "(tools/preprocess_endprompt.py "
            f"or tools/build_endprompt_sidecar.py{' --name ' + name if name else ''}) or list "
            "the prefix in --endprompt-replay-prefixes to train on it as plain replay data")
    sidecar = open_sidecar(path)
    check_belongs_to(sidecar, prefix, full=False)
    layout = sidecar.layout
    if layout.seq_length != seq_length:
        raise UserError(
            f"{path} was built for --seq-length {layout.seq_length} but training uses "
            f"--seq-length {seq_length}; re-run preprocessing or fix --seq-length"
        )
    if target_length is not None and layout.target_length != target_length:
        raise UserError(
            f"{path} was built for target length L={layout.target_length} but training says "
            f"--endprompt-target-length {target_length}; rebuild the sidecar with "
            f"tools/build_endprompt_sidecar.py --data-prefix {prefix} --target-length "
            f"{target_length}{' --name ' + name if name else ''} (the .bin/.idx stay) or fix "
            "the flag"
        )
    if reset_positions:
        raise UserError(
            f"{path}: --reset-position-ids/--reset-attention-mask cannot be combined with "
            "EndPrompt positions; drop those flags"
        )
    check_tokenizer(sidecar, tokenizer_identity)
    return sidecar


def check_tokenizer(sidecar: Sidecar, current: TokenizerIdentity | None) -> None:
    """Refuse a sidecar made with another tokenizer than the training one
    (:meth:`TokenizerIdentity.matches`: vocabulary size, EOD id and vocabulary fingerprint),
    naming both."""
    if current is None:
        return
    recorded = sidecar.header.tokenizer_identity
    if recorded is None or not recorded.is_known:
        logger.warning("%s records no tokenizer identity; cannot check it against %s",
                       sidecar.path, current.describe())
        return
    if not recorded.matches(current):
        raise UserError(
            f"{sidecar.path} was made with tokenizer {recorded.describe()} but training uses "
            f"{current.describe()}; re-run preprocessing with the training tokenizer or fix "
            "--tokenizer-type/--tokenizer-model")


def _config_tokenizer_identity(config: EndPromptDatasetConfig) -> TokenizerIdentity | None:
    if config.endprompt_tokenizer_identity is not None:  # computed once at start-up
        return config.endprompt_tokenizer_identity
    tok = getattr(config, "tokenizer", None)
    if tok is None or getattr(tok, "vocab_size", None) is None:
        return None
    # rank 0 compares the vocabulary fingerprint; the others (same flags) size and EOD only
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    return tokenizer_identity(tok, fingerprint=rank0)


def load_checked_sidecar(prefix: str, config: EndPromptDatasetConfig) -> Sidecar | None:
    """:func:`find_sidecar` with the flags taken from a dataset config."""
    return find_sidecar(prefix, seq_length=config.sequence_length,
                        target_length=config.endprompt_target_length,
                        name=config.endprompt_sidecar_name,
                        replay_prefixes=config.endprompt_replay_prefixes or (),
                        reset_positions=bool(config.reset_position_ids
                                             or config.reset_attention_mask),
                        tokenizer_identity=_config_tokenizer_identity(config))


class EndPromptGPTDataset(GPTDataset):
    """See the module docstring. Constructed by ``BlendedMegatronDatasetBuilder``."""

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str | None,
        indexed_indices: np.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: EndPromptDatasetConfig,
    ) -> None:
        # Decided before GPTDataset.__init__, which builds the indices through
        # ``_build_document_sample_shuffle_indices`` (overridden below). The sidecar was read
        # and checked once per prefix in ``build_low_level_dataset``, not once per split.
        self.sidecar: Sidecar | None = getattr(indexed_dataset, "endprompt_sidecar", None)
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples,
                         index_split, config)
        if self.sidecar is not None:
            layout = self.sidecar.layout
            # How stored samples become training arrays (shared with endprompt-inspect).
            self._rules = SampleRules(
                seq_length=config.sequence_length,
                weights=config.endprompt_loss_weights.over(layout.loss_weights),
                prompt_terminal=self.sidecar.header.terminal_source == "prompt",
                eod=config.tokenizer.eod if config.eod_mask_loss else None,
                pad=pad_in_data(self._pad_token_id, self.dataset.index.dtype),
                extra_token=config.add_extra_token_to_sequence)
            self._causal_mask = None
            # Hot-path helper (see __getitem__): a plain ndarray view of the records (memmap
            # indexing is slower).
            self._records = np.asarray(self.sidecar.records)
            # Fixed placement without PoSE has one record per terminal length: keep their
            # positions/weights and hand out copies (other layouts are drawn per sample).
            self._layouts: dict[bytes, tuple[np.ndarray, np.ndarray]] | None = (
                {} if layout.placement == "fixed" and layout.pose_chunks == 1 else None)
            # A sidecar over an existing corpus: samples are composed from spans of the .bin.
            self._spans = None if self.sidecar.sources is None else span_reader(
                self.dataset.path_prefix, self.sidecar, self.dataset.index.dtype)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: EndPromptDatasetConfig):
        """Megatron's ``IndexedDataset`` for the prefix, with its checked sidecar attached as
        ``endprompt_sidecar`` (``None`` for plain data): read, fingerprinted and checked once
        per prefix, shared by the train/valid/test splits."""
        indexed = GPTDataset.build_low_level_dataset(dataset_path, config)
        indexed.endprompt_sidecar = load_checked_sidecar(dataset_path, config)
        return indexed

    @staticmethod
    def _key_config_attributes() -> list[str]:
        """Cache key: Megatron's attributes plus the EndPrompt ones (and, per prefix, the
        sidecar fingerprint and the loss weights — added in
        ``_build_document_sample_shuffle_indices``)."""
        return GPTDataset._key_config_attributes() + [
            "add_extra_token_to_sequence",
            "endprompt_target_length",
            "endprompt_sidecar_name",
        ]

    # -- indices -----------------------------------------------------------------------
    def _rekey(self, **identifiers) -> None:
        """Add content identifiers to Megatron's index-cache key (``unique_description_hash``,
        computed in ``MegatronDataset.__init__`` from the config and path only)."""
        import hashlib
        import json

        self.unique_identifiers.update(identifiers)
        self.unique_description = json.dumps(self.unique_identifiers, indent=4,
                                             default=lambda o: o.unique_identifiers)
        self.unique_description_hash = hashlib.md5(self.unique_description.encode("utf-8"),
                                                   usedforsecurity=False).hexdigest()

    def _build_document_sample_shuffle_indices(self):
        # Runs inside the constructor, which Megatron's builder calls on rank 0 first, then
        # (after a barrier) on the other ranks: rank 0 verifies/fingerprints once and caches
        # the verdict; the others find it in the cache (see megatron_endprompt.data.sidecar.trust).
        directory = cache_dir(self.dataset.path_prefix, self.config.path_to_cache)
        if self.sidecar is None:
            # Megatron's key ignores file contents: a rewritten replay prefix must not be
            # served its old index.
            self._rekey(idx_sha256=idx_fingerprint(self.dataset.path_prefix, directory))
            return super()._build_document_sample_shuffle_indices()
        if self.config.defer_npy_index_mmap or self.config.fast_cache_load:
            raise UserError(f"{self.dataset_path}: --dataloader-defer-npy-index-mmap and "
                            "--dataloader-fast-cache-load are not supported for EndPrompt prefixes")
        if self.sidecar.sources is None and \
                len(self.sidecar.records) != len(self.dataset.sequence_lengths):
            raise UserError(f"{self.sidecar.path}: {len(self.sidecar.records)} records but "
                            f"{self.dataset_path}.idx has {len(self.dataset.sequence_lengths)} "
                            "sequences; re-run tools/preprocess_endprompt.py")
        ensure_verified(self.sidecar, self.dataset.path_prefix, directory)
        # The layouts are part of the data: a rebuilt sidecar must not hit an old cache.
        identifiers = {"endprompt_sidecar": self.sidecar.header.idx_sha256,
                       "endprompt_layout": self.sidecar.header.layout,
                       "endprompt_loss_weights": self.config.endprompt_loss_weights.as_list()}
        if self.sidecar.sources is not None:  # many sidecars share one .idx
            identifiers["endprompt_spans"] = [self.sidecar.header.records_crc32,
                                              self.sidecar.header.sources["crc32"]]
        self._rekey(**identifiers)
        sample_index = self._load_or_build_sample_index()
        return sample_index, None, None

    @functools.cached_property
    def _units(self) -> np.ndarray:
        """The split's samples (stored sequences, or spans samples inside the split): only
        needed to build the sample index, so a rank that finds it cached never computes it."""
        if self.sidecar.sources is None:
            return self.indices
        return samples_in_split(self.sidecar, self.dataset.index, self.indices)

    def _load_or_build_sample_index(self) -> np.ndarray:
        """Epoch-shuffled sample ids, one per sample; cached like ``GPTDataset``
        (:func:`~megatron_endprompt.data.sample_index.load_or_build_sample_index`)."""
        cache = self.config.path_to_cache
        if cache is None and not self.config.mock:
            cache = os.path.join(self.dataset.path_prefix, "cache",
                                 f"{type(self).__name__}_indices")
        return load_or_build_sample_index(
            units=lambda: self._units, num_samples=self.num_samples,
            seed=self.config.random_seed, cache=cache,
            base=f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}",
            description=self.unique_description, name=type(self).__name__,
            split=self.index_split.name)

    # -- samples -----------------------------------------------------------------------
    def __len__(self) -> int:
        if self.sidecar is None:
            return super().__len__()
        return len(self.document_index)

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        if self.sidecar is None:
            sample = super().__getitem__(idx)
            sample["terminal_mask"] = torch.zeros(self.config.sequence_length,
                                                  dtype=torch.float32)
            return sample
        P = self.config.sequence_length
        doc = int(self.document_index[0 if idx is None else idx])
        text = self.dataset.get(doc) if self._spans is None else self._spans.tokens(doc)
        record = self._records[doc]
        layout = None
        if self._layouts is not None:
            cached = self._layouts.get(key := record.tobytes())
            if cached is None:
                cached = self._layouts.setdefault(key, layout_arrays(record, self._rules))
            layout = (cached[0].copy(), cached[1].copy())
        arrays = assemble_sample(text, record, self._rules, layout=layout)
        if idx is None:
            arrays["loss_mask"][:] = 0.0
        tokens, labels = torch.from_numpy(arrays["tokens"]), torch.from_numpy(arrays["labels"])
        loss_mask = torch.from_numpy(arrays["loss_mask"])
        position_ids = torch.from_numpy(arrays["position_ids"])
        sample = {"tokens": tokens, "labels": labels}
        if self.config.create_attention_mask:
            if self._causal_mask is None:
                self._causal_mask = torch.tril(torch.ones(P, P)).unsqueeze(0) < 0.5
            sample["attention_mask"] = self._causal_mask
        sample["loss_mask"] = loss_mask
        sample["position_ids"] = position_ids
        sample["terminal_mask"] = torch.from_numpy(arrays["terminal_mask"])
        return sample
