"""Train the demo zoo from scratch: `shapes-lm`, `shapes-vlm` and the weak captioner `shapes-vlm-weak`.

Everything is seeded (Python `random` per task, `torch.manual_seed` per model), so a rebuild on the
same machine reproduces the committed weights up to floating-point summation order. The configs in
`common.py` are the recipe; `SMOKE_*` shrinks them to a run of a few seconds for the test suite.
`lm.py` trains shapes-lm, `vlm.py` the VLMs, `aligned.py` the experimental LLaVA on shapes-lm.
"""
from __future__ import annotations

from analysis.zoo.train.common import (  # noqa: F401
    collate, encode, IMAGE_TOKEN, lm_tokenizer, LMConfig, lr_schedule, needle_training_example,
    shifted_loss, SMOKE_LM, SMOKE_VLM, vlm_tokenizer, VLMConfig,
)
from analysis.zoo.train.lm import (  # noqa: F401
    build_lm, continue_lm, LM_PHASES, LM_TASKS, lm_threads, LMPhase2, LMTasks, ScheduledNeedles,
    SMOKE_LM_PHASES, train_lm,
)
from analysis.zoo.train.vlm import (  # noqa: F401
    build_vlm, cfg_feature_layer, COMBOS, continue_vlm, grounding_loss, GROUNDING_PHASE,
    GroundingPhase, make_processor, patch_labels, pixel_tensor, pretrain_vision, save_vlm, scene_table,
    set_attention, shuffled_caption, SMOKE_VLM_PHASES, TABLE_FIELDS, train_vlm, vlm_batch, vlm_collate, vlm_ids,
    VLM_PHASES, VLMPhase2, VLMRows, yes_no_example,
)
from analysis.zoo.train.aligned import (  # noqa: F401
    ALIGNED_VLM_PHASES, AlignedVLMConfig, build_aligned_vlm, SMOKE_ALIGNED, SMOKE_ALIGNED_PHASES,
    train_aligned_vlm, train_projector,
)
