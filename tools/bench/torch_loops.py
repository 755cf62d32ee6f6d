"""PyTorch peers: nn.GRU stepped from Python, and a TorchScript hand-fused loop."""

import os
import tempfile

from bench import weights as weights_lib


def import_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
    return torch
  except Exception:  # pylint: disable=broad-except
    return None


def _torch_gate_order(a, units, axis):
  """Keras [z | r | h] blocks -> PyTorch [r | z | n] along `axis`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  z, r, h = np.split(a, 3, axis=axis)
  return np.concatenate([r, z, h], axis=axis)


class TorchModel:
  """nn.Embedding + nn.GRU + nn.Linear holding the benchmark weights."""

  def __init__(self, torch, weights):
    import numpy as np  # pylint: disable=g-import-not-at-top
    nn = torch.nn
    t = weights.tensors
    units = weights.units
    self.torch = torch
    self.embedding = nn.Embedding(weights.vocab_size, weights.embedding_dim)
    self.gru = nn.GRU(weights.embedding_dim, units, batch_first=True)
    self.linear = nn.Linear(units, weights.vocab_size)

    def tensor(a):
      return torch.from_numpy(np.ascontiguousarray(a, np.float32))

    with torch.no_grad():
      self.embedding.weight.copy_(tensor(t["embedding"]))
      self.gru.weight_ih_l0.copy_(
          tensor(_torch_gate_order(t["layer0_kernel"], units, 1).T))
      self.gru.weight_hh_l0.copy_(
          tensor(_torch_gate_order(t["layer0_recurrent_kernel"], units, 1).T))
      self.gru.bias_ih_l0.copy_(tensor(_torch_gate_order(t["layer0_bias"][0], units, 0)))
      self.gru.bias_hh_l0.copy_(tensor(_torch_gate_order(t["layer0_bias"][1], units, 0)))
      self.linear.weight.copy_(tensor(t["dense_kernel"].T))
      self.linear.bias.copy_(tensor(t["dense_bias"]))
    self.mask = tensor(weights_lib.banned_mask(weights))

  def prime(self, prompt_ids):
    """Runs the prompt: returns (last logits [B, V], h [1, B, U])."""
    out, h = self.gru(self.embedding(prompt_ids))
    return self.linear(out[:, -1]) + self.mask, h


class TorchGRU:
  """The straightforward PyTorch loop: nn.GRU one step at a time from Python."""

  def __init__(self, torch, torch_model, settings):
    self.torch = torch
    self.m = torch_model
    self.settings = settings

  def __call__(self, prompt_ids, seed):
    torch = self.torch
    m = self.m
    gen = torch.Generator().manual_seed(seed)
    temperature = self.settings.temperature
    with torch.inference_mode():
      logits, h = m.prime(torch.from_numpy(prompt_ids).long())
      out = torch.empty(prompt_ids.shape[0], self.settings.num_chars,
                        dtype=torch.long)
      for t in range(self.settings.num_chars):
        probs = torch.softmax(logits / temperature, -1)
        ids = torch.multinomial(probs, 1, generator=gen)
        out[:, t] = ids[:, 0]
        y, h = m.gru(m.embedding(ids), h)
        logits = m.linear(y[:, 0]) + m.mask
      return out.numpy()


_TORCH_FUSED_SOURCE = '''
import torch

@torch.jit.script
def fused_loop(table, recurrent, candidate_bias, dense, dense_bias, h, logits,
               num_steps: int, temperature: float):
    units = h.shape[1]
    out = torch.empty(num_steps, h.shape[0], dtype=torch.long)
    for t in range(num_steps):
        noise = torch.empty_like(logits).exponential_()
        ids = torch.argmax(logits / temperature - torch.log(noise), 1)
        out[t] = ids
        x = table.index_select(0, ids)
        hp = torch.mm(h, recurrent)
        zr = torch.sigmoid(x[:, :2 * units] + hp[:, :2 * units])
        z = zr[:, :units]
        r = zr[:, units:]
        n = torch.tanh(x[:, 2 * units:] + r * (hp[:, 2 * units:] + candidate_bias))
        h = n + z * (h - n)
        logits = torch.addmm(dense_bias, h, dense)
    return out.t()
'''


class TorchFused:
  """TorchScript loop, hand-fused cell over a [V, 3U] input table, Gumbel-max."""

  def __init__(self, torch, torch_model, weights, settings):
    import importlib.util  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.m = torch_model
    self.settings = settings
    # TorchScript needs the function's source in a real file.
    self._dir = tempfile.mkdtemp(prefix="rnnstep_bench_torch_")
    path = os.path.join(self._dir, "torch_fused_loop.py")
    with open(path, "w") as f:
      f.write(_TORCH_FUSED_SOURCE)
    spec = importlib.util.spec_from_file_location("torch_fused_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    self.loop = module.fused_loop
    t = weights.tensors
    units = weights.units
    bias = t["layer0_bias"]
    input_bias = bias[0] + np.concatenate([bias[1, :2 * units],
                                           np.zeros([units], np.float32)])
    table = t["embedding"] @ t["layer0_kernel"] + input_bias
    self.table = torch.from_numpy(np.ascontiguousarray(table, np.float32))
    self.recurrent = torch.from_numpy(np.ascontiguousarray(
        t["layer0_recurrent_kernel"]))
    self.candidate_bias = torch.from_numpy(np.ascontiguousarray(bias[1, 2 * units:]))
    self.dense = torch.from_numpy(np.ascontiguousarray(t["dense_kernel"]))
    self.dense_bias = torch.from_numpy(np.ascontiguousarray(t["dense_bias"])
                                       ) + torch_model.mask

  def __call__(self, prompt_ids, seed):
    torch = self.torch
    torch.manual_seed(seed)
    with torch.inference_mode():
      logits, h = self.m.prime(torch.from_numpy(prompt_ids).long())
      out = self.loop(self.table, self.recurrent, self.candidate_bias, self.dense,
                      self.dense_bias, h[0].contiguous(), logits,
                      self.settings.num_chars, float(self.settings.temperature))
      return out.numpy()

