r"""SWE GRPO: an agent writes a patch, the sandbox runs the held-out tests, the verdict is the reward.

On this machine (the embedded default, variant `tiny`: local Ray, a local sandbox fleet, CPU vLLM,
a tiny model made locally, the shipped `tiny` task subset):

  python -m dockyard.launch --config=configs/swe.py --workdir=workdirs/swe

On a GPU cluster (Qwen2.5-7B-Instruct, 4 nodes x 8 GPUs, 3 trainer + 1 inference, async GRPO):

  python -m dockyard.launch --config=configs/swe.py:full \
      --config.grpo.num_prompts_per_step=32 --workdir=/path/to/workdir

Variants (the `:arg` string): `tiny` (default) | `full`; `torch` selects the PyTorch trainer;
`sync` turns async GRPO off in `full` (tiny runs sync; `--config.grpo.async_grpo.enabled=True`
turns it on there); `moe` makes the tiny model a Qwen3-MoE with router losses and an `expert` mesh
axis (docs/moe.md). Combine with commas: `:full,torch`.
Print the plan without starting anything: `--config.run.dry_run=True`.
Sweep: `python -m launch.sweep --config=configs/swe.py:tiny --dry_run`.
"""
import ml_collections

from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, full=False, torch=False, sync=False, runlocal=False,
                             moe=False)
  full = arg.full and not (arg.tiny or arg.runlocal)
  config = ml_collections.ConfigDict()

  # run: identity, seed, mode, and how long.
  config.run = dict(
      name="swe_full" if full else "swe_tiny",
      variant="full" if full else "tiny",   # the run plan's label: tiny | full (smollm variants set "smollm")
      seed=0,
      mode="train",          # train | eval (eval: generate on the test split, report resolve rate)
      dry_run=False,         # print the resolved fleets, placements and mesh; start nothing
      ray_address="",        # '' starts a local Ray; 'auto' or 'ray://host:10001' joins one
  )

  # cluster: the machines the fleets are placed on (the trainer's device count comes from here).
  config.cluster = dict(
      num_nodes=4 if full else 1,
      accelerators_per_node=8 if full else 0,   # 0: CPU only
      trainer_nodes=3 if full else 1,
      inference_nodes=1 if full else 1,
      colocated=not full,                       # trainer and vLLM share the devices
      cpu_devices=1,                            # JAX CPU devices when accelerators_per_node == 0
  )

  # policy: the model being trained and the framework that trains it.
  config.policy = dict(
      backend="torch" if arg.torch else "jax",   # jax | torch
      model_name_or_path="Qwen/Qwen2.5-7B-Instruct" if full else "",
      # A tiny model made locally (transformers config + random init + save_pretrained) when
      # model_name_or_path is empty; cached by its spec under ~/.cache/dockyard/models.
      tiny=dict(
          family="qwen2",     # qwen2 | qwen3 | llama
          hidden_size=128,
          intermediate_size=256,
          num_hidden_layers=2,
          num_attention_heads=4,
          num_key_value_heads=2,
          vocab_size=1024,    # the tokenizer is trained locally to this size
          tie_word_embeddings=True,
          max_position_embeddings=4096,
          tokenizer_from="",  # '': that local tokenizer; or a model (dir | package:<name>) whose tokenizer to take
      ),
      dtype="bfloat16" if full else "float32",         # compute dtype
      param_dtype="float32",
      remat=full,                                       # jax.checkpoint each decoder layer
      max_seq_len=16384 if full else 2048,
      seq_bucket=64,   # JAX trainer: batch lengths pad to a multiple of this (one compile per length)
      # > 0: pack sequences first-fit decreasing into rows of this many tokens, micro_batch_size
      # rows a micro-batch (segment-masked attention; docs/packing.md). 0: one sequence a row.
      packing_row_tokens=0,
      # LoRA (both backends, docs/lora.md): adapters W + (alpha / rank) * B A on `targets`, the
      # base frozen, optimizer state and checkpoints for the adapters alone.
      lora=dict(
          enabled=False,
          rank=8,
          alpha=16.0,
          dropout=0.0,
          targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
          # JAX only: the frozen base held 'none' (as loaded), 'int8' (per output channel) or
          # 'nf4' (QLoRA's 4-bit NormalFloat, blocks of 64), dequantized in the forward pass.
          base_quant="none",
      ),
  )

  # mesh: trainer devices as (data, fsdp, tensor); -1 is "the rest". Logical axis rules map
  # the names used inside the modules to mesh axes. An optional 'sequence' axis splits each row's
  # tokens (context parallelism, docs/context_parallel.md).
  config.mesh = dict(
      shape=(1, -1, 1),
      axes=("data", "fsdp", "tensor"),
      rules=(
          ("batch", ("data", "fsdp")),
          ("embed", "fsdp"),
          ("mlp", "tensor"),
          ("heads", "tensor"),
          ("vocab", "tensor"),
      ),
  )

  # optim: AdamW with warmup + cosine decay and global-norm clipping.
  config.optim = dict(
      # tiny: the rate the measured run (docs/swe_default.md, r5) trained GRPO at: 5e-5 constant.
      # (It was configured as 5e-4 with a cosine decay, but the SFT warm start's steps then
      # advanced the schedule past its end; steps under the warm start's rate no longer count.)
      lr=1e-6 if full else 5e-5,
      warmup_steps=10 if full else 0,
      decay_steps=0,                    # 0: grpo.max_num_steps
      end_lr_factor=0.1 if full else 1.0,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      weight_decay=0.01,
      max_grad_norm=1.0,
      micro_batch_size=4 if full else 8,   # sequences per forward/backward; gradients accumulate
      # Unpacked, either trainer: > 0 groups whole sequences into micro-batches of at most this many
      # (padded) tokens instead of micro_batch_size rows (dynamic batching; docs/packing.md).
      micro_batch_tokens=0,
  )

  # grpo: the algorithm and the loop.
  config.grpo = dict(
      # The update the loop takes on each step's scored groups: "policy_gradient" (GRPO: the
      # clipped PG loss, loss_fn.*) or "dpo" (online DPO on each group's best-vs-worst pair, with
      # the preference loss of a grpo.preference section: configs/online_dpo.py).
      objective="policy_gradient",
      num_prompts_per_step=8 if full else 4,
      num_generations_per_prompt=8,
      # Optimizer steps per batch (PPO-style minibatches of its sequences). 1: one step, the ratio
      # is exactly 1 at update time. > 1: later minibatches train against the prev logprobs of the
      # batch, so ratio clipping (and clip-higher) act.
      num_minibatches=1,
      max_num_steps=500 if full else 50,   # tiny: 2-20 s a step here, depending on the load
      val_period=10,         # validate every this many steps and at the last; 0: never
      val_at_start=True,
      max_val_samples=64 if full else 20,   # tiny: all 20 training tasks (validation = train here)
      advantage=dict(
          estimator="grpo",         # grpo | gdpo | reinforce++
          leave_one_out=True,
          normalize_std=False,
      ),
      dynamic_sampling=False,       # drop groups whose rewards have zero variance (DAPO)
      reward_shaping=dict(
          scale=1.0,
          malformed_penalty=0.0,    # subtracted from the reward of a completion that cannot be parsed (>= 0)
          overlong_penalty=0.0,     # DAPO soft overlong punishment: max amount subtracted (>= 0)
          overlong_buffer=0,        # tokens before max_new_tokens where the penalty ramps up
      ),
      sft_warmup=dict(
          # tiny, measured: 80 steps (NLL ~0.4) -> every greedy patch malformed, val 0; 100 -> val
          # 0.15 but 80-90% of samples malformed (too few mixed groups); 150 (NLL 0.02) -> val 0.7.
          steps=0 if full else 120,  # SFT on the training split's gold answers before GRPO
          lr=3e-3,
          batch_size=8,
      ),
      async_grpo=dict(
          enabled=full and not arg.sync,   # tiny: sync (the measured recipe, docs/swe_default.md)
          max_trajectory_age_steps=1,
          in_flight_weight_updates=True,
          in_flight_policy="finish",   # finish (on old weights) | abort (and resubmit)
          buffer_size=0,               # trajectories (pending + ready); 0: 2 x prompts x generations
          rollout_timeout_s=600.0,
          score_timeout_s=600.0,
          on_timeout="drop",           # drop | retry
          consume_in_order=False,      # True: train on the lowest-numbered prompts (reproducible)
      ),
  )

  # loss_fn: the clipped policy-gradient loss (ClippedPGLossFn semantics).
  config.loss_fn = dict(
      ratio_clip_min=0.2,                 # epsilon low
      ratio_clip_max=0.28,                # epsilon high (DAPO clip-higher)
      ratio_clip_c=3.0,                   # dual-clip constant (<= 1 disables)
      reference_policy_kl_penalty=0.0 if not full else 0.01,  # k3; 0 skips the reference forward
      use_importance_sampling_correction=True,
      truncated_importance_sampling_ratio=2.0,
      ratio_level="token",                # token | sequence (GSPO: one ratio per sequence)
      # token: batch token mean (DAPO) | sequence: per-sequence mean, then mean (GRPO, DeepSeekMath
      # eq. 3) | constant: sum / (sequences x rollout.max_new_tokens) (Dr. GRPO)
      normalization="token",
  )

  # rollout: vLLM engines on Ray.
  config.rollout = dict(
      num_engines=1,
      cpus_per_engine=4.0 if full else 0.5,   # Ray CPUs per engine bundle (placement group)
      max_restarts=3,                         # per fleet call: engine restarts before giving up
      # None: the driver generates, decodes and scores (colocated) | 'object_store': a worker beside
      # each engine generates and scores; groups reach the trainer through Ray's object store
      # (dockyard/grpo/data_plane.py; single-shot envs only)
      data_plane=ml_collections.config_dict.placeholder(str),
      tensor_parallel_size=8 if full else 1,
      max_model_len=16384 if full else 2048,
      dtype="bfloat16" if full else "float32",
      gpu_memory_utilization=0.85,
      cpu_kvcache_space_gib=1,
      enforce_eager=not full,
      max_new_tokens=4096 if full else 256,
      temperature=1.0 if full else 0.7,   # tiny: T=1 samples of the warm-started model rarely parse
      top_p=1.0,                          # training needs 1.0: the trainer scores the full softmax(z / T)
      val_temperature=0.0,
  )

  # refit: moving weights trainer -> vLLM, and the canary that checks they arrived right.
  config.refit = dict(
      transport="auto",        # auto | inprocess | object_store | shared_memory | nccl
      # Under policy.lora: merge (W + scale * B A of the adapted projections only, after one full
      # sync) | adapter (vLLM's LoRA: a PEFT adapter directory per version; in-process engine).
      lora_mode="merge",
      canary=dict(
          enabled=True,
          max_abs_logprob_delta=1e-2 if full else 1e-3,
          # > 0: also bound the probe's MEAN |delta| (and compare mean changes in the "moved since
          # the last sync" check), for an engine whose arithmetic differs from the trainer's, e.g.
          # qwen3_next's bf16-only CPU engine (docs/qwen3_next.md); 0: the max bound alone.
          max_mean_abs_logprob_delta=0.0,
      ),
  )

  # sandbox: the executor fleet that runs tests (Ray actors serving HTTP); started locally when
  # env.code.sandbox_urls is empty.
  config.sandbox = dict(
      num_executors=8 if full else 1,
      slots=0,                   # concurrent runs per executor; 0: the node's cores
      cpus_per_executor=0.0,     # the executor's Ray CPU reservation; 0: max(slots, 1)
      port=9090,
      queue_size=1024,
      cache_dir="",              # '' : ~/.cache/dockyard/sandbox
      repos_dir="",              # '' : $DOCKYARD_REPOS_DIR or ~/.cache/dockyard/repos
      disk_mb=1024,              # per run: tmpfs for writes into the tree, and for /tmp
      timeout_s=120.0 if full else 60.0,
      memory_mb=4096,
      cpu_time_s=120,
      max_processes=256,
      max_file_size_mb=64,
      max_open_files=1024,
      max_output_bytes=1 << 20,
  )

  # env: the task + completion -> reward environment.
  config.env = dict(
      name="swe",               # swe | math
      code=dict(
          sandbox_urls=("http://localhost:9090",) if full else (),  # () : the local fleet
          # tiny: pass_rate (a patch that applies keeps PASS_TO_PASS green) is denser; the reported
          # metric is still the resolve rate.
          reward="resolved" if full else "pass_rate",     # resolved | pass_rate
          # tiny: short prompts keep each train step cheap on 2 CPU cores (issue ~200 + code excerpt).
          prompt_token_budget=12000 if full else 512,
          issue_token_budget=0 if full else 200,   # >0: the problem statement is cut to this many tokens
          request_timeout_s=600.0,
          max_in_flight=256 if full else 16,
      ),
  )

  # data: task sets in the SWE-bench instance schema.
  config.data = dict(
      train="data/swe/train.jsonl" if full else "data/swe/tiny/train.jsonl",
      validation="data/swe/tiny/train.jsonl" if not full else "data/swe/validation.jsonl",
      test="data/swe/test.jsonl",
      manifest="data/swe/manifest.json",   # pinned sdists (sha256) the task repos are built from
      shuffle_seed=0,
  )

  # checkpoint: one orbax CheckpointManager; best-k by a validation metric.
  config.checkpoint = dict(
      enabled=True,
      save_period=10 if full else 5,
      keep_top_k=3,
      metric="val/resolve_rate",
      metric_mode="max",
  )

  # eval (run.mode=eval, dockyard/eval.py): pass@1 of one sample per test task at
  # rollout.val_temperature (greedy at 0, Wilson 95% CI), then, when pass_k > 0, num_samples samples
  # per task at `temperature` and the unbiased pass@k (Chen et al. 2021) with a bootstrap 95% CI.
  config.eval = dict(
      pass_k=0,                  # k of pass@k; 0: the greedy pass@1 only (a sandbox run per sample)
      num_samples=8,             # samples per task (n >= pass_k)
      temperature=1.0,           # their sampling temperature (> 0)
      bootstrap_resamples=1000,  # resamples over tasks for the pass@k intervals
  )

  # logging: TensorBoard + metrics.jsonl in the workdir; a PNG reward curve at the end.
  config.logging = dict(
      tensorboard=True,
      png_curve=True,
  )

  # moe: a Mixture-of-Experts policy (jax backend): the tiny model's experts, the router losses
  # and aux-loss-free balancing (dockyard/trainer_jax/moe.py), and an `expert` mesh axis that
  # splits the experts (tokens split over it too, as a data axis).
  if arg.moe:
    config.policy.tiny.update(family="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=64, norm_topk_prob=True)
    config.policy.moe = dict(
        aux_loss_coef=1e-3,      # Qwen3-MoE's router_aux_loss_coef
        z_loss_coef=0.0,         # ST-MoE's router z-loss weight
        bias_update_rate=0.0,    # DeepSeek-V3 bias step per optimizer step; 0 = off
    )
    config.mesh = dict(
        shape=(1, -1, 1, 1),
        axes=("data", "fsdp", "expert", "tensor"),
        rules=(
            ("batch", ("data", "fsdp", "expert")),
            ("embed", "fsdp"),
            ("mlp", "tensor"),
            ("heads", "tensor"),
            ("vocab", "tensor"),
            ("expert", "expert"),
        ),
    )
  return config


def get_hyper(h, arg=None):
  """The sweep: learning rate x group size (`python -m launch.sweep --config=configs/swe.py[:arg]`).
  The rates bracket the one the variant trains at (half and double it)."""
  lr = get_config(arg).optim.lr
  return h.product([
      h.sweep("config.optim.lr", [lr / 2, lr * 2]),
      h.sweep("config.grpo.num_generations_per_prompt", [4, 8]),
      h.fixed("config.loss_fn.ratio_clip_max", 0.28),
  ])
