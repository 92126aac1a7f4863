"""fpsim's TrainerCallback on a tiny GPT-2 built from a config (random weights, nothing downloaded):
python docs/examples/trainer_callback.py"""

import torch
import transformers

from fpsim.integrations import TrainerCallback


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2,
                                                             n_head=2, attn_implementation="eager"))
args = transformers.TrainingArguments(output_dir="hf-out", max_steps=8, per_device_train_batch_size=8,
                                      report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                                      disable_tqdm=True)
callback = TrainerCallback(out="fpsim-report-gpt2", formats=("fp16", "bf16"))
transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train()
print(callback.report.summary_table())
