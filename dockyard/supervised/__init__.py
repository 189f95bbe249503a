"""dockyard.supervised: supervised fine-tuning on chat data (configs/sft.py).

  data.py  conversations (the math env's gold answers as chats, or a JSONL of TRL/HF `messages`),
           encoded with the assistant-turn mask of `dockyard.conversation`, and their batches
  loop.py  `sft_train`: `dockyard.sft.sft_loop` (the one SFT loop, also the GRPO warm start's) with
           held-out loss, greedy pass@1 on the env's held-out tasks, checkpoints and resume
"""
