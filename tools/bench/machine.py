"""What the benchmark prints about the machine it runs on (the table's context)."""

import os
import platform


def cpu_flags() -> str:
  """The CPU features that decide the fastest path (rnnstep.cpu), as a line."""
  from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
  return " ".join(cpu.info().features) or "none of " + " ".join(cpu.FEATURES)


def has_flag(flag: str) -> bool:
  from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
  return flag in cpu.info().features


def l3_cache() -> str:
  """The L3 size as the kernel reports it (e.g. '32768K'), or '?'."""
  base = "/sys/devices/system/cpu/cpu0/cache"
  try:
    for index in sorted(os.listdir(base)):
      with open(os.path.join(base, index, "level")) as f:
        if f.read().strip() != "3":
          continue
      with open(os.path.join(base, index, "size")) as f:
        return f.read().strip()
  except OSError:
    pass
  return "?"


def usable_cores() -> int:
  from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
  return cpu.usable_cores()


def machine_facts(tf, torch) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    import keras  # pylint: disable=g-import-not-at-top
    keras_version = keras.__version__
  except ImportError:
    keras_version = None
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    onednn = bool(_pywrap_util_port.IsMklEnabled())
  except (ImportError, AttributeError):
    onednn = None
  from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
  facts = {
      "cpu": cpu.info().name,
      "cpu_kind": cpu.kind(),
      "cpu_flags": cpu_flags(),
      "amx": has_flag("amx_bf16") and has_flag("amx_tile"),
      "avx512_bf16": has_flag("avx512_bf16"),
      "l3": l3_cache(),
      "cores": os.cpu_count(),
      "usable_cores": usable_cores(),
      "python": platform.python_version(),
      "numpy": np.__version__,
      "tensorflow": tf.__version__,
      "keras": keras_version,
      "torch": getattr(torch, "__version__", None),
      "onednn": onednn,
      "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(unset)"),
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", "(unset)"),
      "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
      "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
      "torch_threads": torch.get_num_threads() if torch else None,
      "loadavg_start": list(os.getloadavg()),
  }
  return facts


def print_header(facts, settings, tensors_desc):
  print("# rnnstep benchmark")
  print(f"machine: {facts['cpu']} | {facts['cores']} cores "
        f"({facts['usable_cores']} usable) | L3 {facts['l3']} | AMX "
        f"{'yes' if facts['amx'] else 'no'} | AVX512-BF16 "
        f"{'yes' if facts['avx512_bf16'] else 'no'} | kind {facts['cpu_kind']} | "
        f"TF {facts['tensorflow']}")
  print(f"cpu flags: {facts['cpu_flags']}")
  print(f"software: python {facts['python']}, numpy {facts['numpy']}, "
        f"tensorflow {facts['tensorflow']}, keras {facts['keras']}, "
        f"torch {facts['torch'] or 'not importable (torch variants skipped)'}")
  print(f"oneDNN: {facts['onednn']} (TF_ENABLE_ONEDNN_OPTS="
        f"{facts['TF_ENABLE_ONEDNN_OPTS']}); XLA_FLAGS={facts['XLA_FLAGS']}")
  intra = facts["tf_intra_op_threads"]
  inter = facts["tf_inter_op_threads"]
  print(f"threads: tf.config.threading intra_op={intra} inter_op={inter} "
        f"(0 = TF default: all cores); torch={facts['torch_threads']}")
  print(f"load average at start: {' '.join(f'{x:.2f}' for x in facts['loadavg_start'])}"
        f" (>{facts['usable_cores']} means other work shares the cores: noisy)")
  print(f"model: {tensors_desc}")
  print(f"run: {settings.num_chars} chars per row after a {settings.prompt_len}-char "
        f"prompt, temperature {settings.temperature}, batches "
        f"{settings.batch_sizes}, {settings.rounds} round(s) after warm-up"
        f"{' [QUICK MODE]' if settings.quick else ''}")
  print()

