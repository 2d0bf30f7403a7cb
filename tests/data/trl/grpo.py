"""A real TRL GRPOTrainer run on CPU, for the TRL tests: a tiny Llama and a word-level tokenizer made
here (nothing downloaded), three steps, one reward function (`longer`). Returns how many raypulse
callbacks the trainer got without asking for one (the setup hook's work)."""

from __future__ import annotations

import sys


def train(model_dir: str, output_dir: str) -> int:
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    from exporter.progress.trl import RaypulseCallback

    words = ["<pad>", "<eos>", "<unk>"] + [chr(c) for c in range(97, 123)]
    vocabulary = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    vocabulary.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocabulary, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1))
    model.save_pretrained(model_dir)  # GRPO's reference model is read from there
    tokenizer.save_pretrained(model_dir)

    def longer(completions: list[str], **kwargs: object) -> list[float]:
        return [len(c) / 10 for c in completions]

    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=longer, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": ["a b c", "d e f", "g h i", "j k l"] * 4}),
        args=GRPOConfig(output_dir=output_dir, per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=6, max_steps=3, logging_steps=1, report_to="none", use_cpu=True,
                        bf16=False, save_strategy="no", beta=0.1, seed=7))
    attached = sum(isinstance(c, RaypulseCallback) for c in trainer.callback_handler.callbacks)
    trainer.train()
    return attached


if __name__ == "__main__":
    print(train(sys.argv[1], sys.argv[2]))
