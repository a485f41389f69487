"""Models: checkpoints (GGUF, HF directories, random presets) made into one Flax decoder that takes ablation masks
and fills as inputs (`decoder`), its configs, loading and the PyTorch references the tests compare against."""
