"""Draft heads that read the target's features (shared by jaxspec.drafters and train/)."""
from .eagle import DraftVocab, EagleConfig, EagleHead, eagle_step, fuse_features, init_eagle_params
from .mtp import MTPConfig, init_mtp_params, mtp_logits, mtp_window

__all__ = ["DraftVocab", "EagleConfig", "EagleHead", "eagle_step", "fuse_features", "init_eagle_params", "MTPConfig", "init_mtp_params",
           "mtp_logits", "mtp_window"]
