// rnnstep web runtime: the generation loop of rnnstep.generate in plain
// JavaScript (Float32Array weights, float32 rounding by Math.fround, the
// counter-hash noise in exact uint32 arithmetic by Math.imul). Written by
// `rnnstep-export --format=web`; see docs/guide/web.md.
//
// It is one classic-script expression, so index.html can inline it (Chromium
// refuses module scripts and fetch from file://) and rnnstep.js can wrap it as
// an ES module.
var rnnstep = (function () {
  "use strict";

  const fround = Math.fround;
  const LOGIT_LIMIT = fround(1e30);

  /** A bad argument: one line, naming it (`argument`), as the library's. */
  class RnnstepError extends Error {
    constructor(argument, message) {
      super(message.replace(/\s*\n\s*/g, " "));
      this.name = "RnnstepError";
      this.argument = argument;
    }
  }

  // ---- The noise: sampling.py's counter hash, bit for bit. ----------------

  // MurmurHash3's finalizer (sampling.fmix32) on uint32 numbers.
  function fmix32(x) {
    x = (x ^ (x >>> 16)) >>> 0;
    x = Math.imul(x, 0x85EBCA6B) >>> 0;
    x = (x ^ (x >>> 13)) >>> 0;
    x = Math.imul(x, 0xC2B2AE35) >>> 0;
    return (x ^ (x >>> 16)) >>> 0;
  }

  // sampling.row_keys for one int64 seed (a BigInt) and row index.
  function rowKey(seed, index) {
    const bits = BigInt.asUintN(64, seed);
    const low = Number(bits & 0xFFFFFFFFn);
    const high = Number(bits >> 32n);
    let key = fmix32((low ^ 0x9E3779B9) >>> 0);
    key = fmix32((key ^ high) >>> 0);
    return fmix32((key ^ index) >>> 0);
  }

  // sampling.uniform_noise's bits for (key, step), one per id.
  function noiseBits(key, step, size, out) {
    const stepKey = fmix32((key ^ fmix32((step + 0x632BE5AB) >>> 0)) >>> 0);
    for (let id = 0; id < size; id++) {
      const salt = (Math.imul(id, 0x27D4EB2F) + 0x165667B1) >>> 0;
      out[id] = fmix32((stepKey ^ salt) >>> 0);
    }
    return out;
  }

  // The uniform float32 in (0, 1] of sampling.uniform_noise, with its float32
  // roundings ((m + 0.5) rounds for m >= 2**23, as TensorFlow's does).
  function uniformOf(bits) {
    return fround(fround((bits >>> 8) + 0.5) * 5.9604644775390625e-8);
  }

  function gumbelOf(bits) {
    return fround(-fround(Math.log(fround(-fround(Math.log(uniformOf(bits)))))));
  }

  // ---- The option declarations (from rnnstep.decoding.options). ----------

  function describe(value) {
    if (typeof value === "string") return JSON.stringify(value);
    if (typeof value === "bigint") return value.toString();
    if (value === undefined) return "undefined";
    try { return JSON.stringify(value) ?? String(value); } catch (e) { return String(value); }
  }

  function holds(range, value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return false;
    if (range.integer && !Number.isInteger(value)) return false;
    if (range.low !== null && (range.low_open ? value <= range.low : value < range.low)) return false;
    if (range.high !== null && (range.high_open ? value >= range.high : value > range.high)) return false;
    return true;
  }

  const INT64_LOW = -(2n ** 63n), INT64_HIGH = 2n ** 63n - 1n;

  function checkSeed(seed) {
    if (seed === undefined || seed === null) {
      // Fresh randomness, as the library's seed=None: a random 53-bit seed.
      const words = new Uint32Array(2);
      crypto.getRandomValues(words);
      return (BigInt(words[0] & 0x1FFFFF) << 32n) | BigInt(words[1]);
    }
    let big = null;
    if (typeof seed === "bigint") big = seed;
    else if (typeof seed === "number" && Number.isSafeInteger(seed)) big = BigInt(seed);
    else if (typeof seed === "string" && /^\s*-?\d+\s*$/.test(seed)) big = BigInt(seed.trim());
    if (big === null || big < INT64_LOW || big > INT64_HIGH) {
      throw new RnnstepError("seed", "seed must be null (random) or a 64-bit " +
        "integer (a safe-integer number, a BigInt or a decimal string), got " +
        describe(seed));
    }
    return big;
  }

  // ---- The model. ---------------------------------------------------------

  function sigmoid(x) { return fround(1 / (1 + Math.exp(-x))); }
  function tanh(x) { return fround(Math.tanh(x)); }

  // out[r] = fround(sum_c w[(first + r) * cols + c] * x[c]) for r < rows: a
  // transposed kernel's rows as dot products, summed in float64 (TensorFlow's
  // float32 kernels sum in their own order; float64 stays within their
  // rounding of the exact sum).
  function matvec(w, first, rows, cols, x, out) {
    for (let r = 0; r < rows; r++) {
      let base = (first + r) * cols, a0 = 0, a1 = 0, a2 = 0, a3 = 0, c = 0;
      for (; c + 3 < cols; c += 4, base += 4) {
        a0 += w[base] * x[c];
        a1 += w[base + 1] * x[c + 1];
        a2 += w[base + 2] * x[c + 2];
        a3 += w[base + 3] * x[c + 3];
      }
      for (; c < cols; c++, base++) a0 += w[base] * x[c];
      out[r] = fround((a0 + a1) + (a2 + a3));
    }
    return out;
  }

  // Ties to even, as TensorFlow's round and XNNPACK's rounding.
  function rint(v) {
    const r = Math.round(v);
    return (r - v === 0.5 && r % 2 !== 0) ? r - 1 : r;
  }

  // An int8 model's product (rnnstep/model/int8_arithmetic.py): XNNPACK's
  // dynamic-range int8 arithmetic. x is rounded to int8 asymmetrically
  // (each float32 op rounded as written there), the integer sums are exact
  // in float64, and each sum is scaled back by the row's scale, then its
  // column's. kernel: {w: q [rows x cols] (float32 integers), scale: per
  // row, sums: each row's sum of q}.
  function int8Product(kernel, first, rows, cols, x, out) {
    let low = 0, high = 0;
    for (let c = 0; c < cols; c++) {
      if (x[c] < low) low = x[c];
      if (x[c] > high) high = x[c];
    }
    const m = low === high ? 1 : fround(255 / fround(high - low));
    const lowScaled = fround(low * m), highScaled = fround(high * m);
    let zp = fround(fround(-128 + lowScaled) + fround(127 + highScaled)) > 0
      ? fround(-128 - lowScaled) : fround(127 - highScaled);
    zp = rint(Math.min(127, Math.max(-128, zp)));
    const qx = kernel.row || (kernel.row = new Float64Array(cols));
    for (let c = 0; c < cols; c++) {
      qx[c] = Math.min(127, Math.max(-128, rint(fround(x[c] * m)) + zp));
    }
    const rowScale = fround(1 / m), w = kernel.w;
    for (let r = 0; r < rows; r++) {
      let base = (first + r) * cols, sum = 0;
      for (let c = 0; c < cols; c++, base++) sum += qx[c] * w[base];
      const scale = kernel.scale[first + r];
      const exact = sum - zp * kernel.sums[first + r];
      out[r] = scale === 0 ? 0 : fround(fround(fround(exact) * rowScale) * scale);
    }
    return out;
  }

  // x @ a kernel: `matvec` for float32 weights, `int8Product` for int8.
  function product(kernel, first, rows, cols, x, out) {
    return kernel.scale ? int8Product(kernel, first, rows, cols, x, out)
      : matvec(kernel.w, first, rows, cols, x, out);
  }

  // A transposed kernel `name` ([rows x cols]) and, for an int8 model's,
  // its scales and rows' sums.
  function kernelOf(tensors, name, cols) {
    const w = tensors[name], scale = tensors[`${name}_scale`];
    if (!scale) return {w};
    const sums = new Float64Array(scale.length);
    for (let r = 0; r < scale.length; r++) {
      let sum = 0;
      for (let c = 0; c < cols; c++) sum += w[r * cols + c];
      sums[r] = sum;
    }
    return {w, scale, sums};
  }

  const GATES = {gru: 3, lstm: 4, simple_rnn: 1};

  class Layer {
    constructor(spec, tensors, index) {
      this.kind = spec.kind;
      this.units = spec.units;
      this.inputs = spec.inputs;
      this.resetAfter = spec.kind === "gru" ? spec.reset_after : false;
      this.width = GATES[spec.kind] * spec.units;
      this.recurrent = kernelOf(tensors, `layer${index}_recurrent_kernel_t`, spec.units);
      this.kernel = index ? kernelOf(tensors, `layer${index}_kernel_t`, spec.inputs) : null;
      this.inputBias = index ? tensors[`layer${index}_input_bias`] : null;
      this.candidateBias = this.resetAfter ? tensors[`layer${index}_candidate_bias`] : null;
      this.xProj = new Float32Array(this.width);
      this.hProj = new Float32Array(this.width);
      this.resetH = this.resetAfter ? null : new Float32Array(this.units);
    }

    zeroState() {
      const state = {h: new Float32Array(this.units)};
      if (this.kind === "lstm") state.c = new Float32Array(this.units);
      return state;
    }

    // x @ K + input bias for layers above the first (cells.project_inputs).
    project(x) {
      product(this.kernel, 0, this.width, this.inputs, x, this.xProj);
      for (let j = 0; j < this.width; j++) this.xProj[j] = fround(this.xProj[j] + this.inputBias[j]);
      return this.xProj;
    }

    // One step (cells.py's gate math, each float32 op rounded); updates state.
    step(xp, state) {
      const U = this.units, h = state.h, hp = this.hProj;
      if (this.kind === "simple_rnn") {
        product(this.recurrent, 0, U, U, h, hp);
        for (let j = 0; j < U; j++) h[j] = tanh(fround(xp[j] + hp[j]));
      } else if (this.kind === "lstm") {
        product(this.recurrent, 0, 4 * U, U, h, hp);
        const c = state.c;
        for (let j = 0; j < U; j++) {
          const i = sigmoid(fround(xp[j] + hp[j]));
          const f = sigmoid(fround(xp[U + j] + hp[U + j]));
          const g = tanh(fround(xp[2 * U + j] + hp[2 * U + j]));
          const o = sigmoid(fround(xp[3 * U + j] + hp[3 * U + j]));
          const cNew = fround(fround(f * c[j]) + fround(i * g));
          c[j] = cNew;
          h[j] = fround(o * tanh(cNew));
        }
      } else if (this.resetAfter) {
        product(this.recurrent, 0, 3 * U, U, h, hp);
        const cb = this.candidateBias;
        for (let j = 0; j < U; j++) {
          const z = sigmoid(fround(xp[j] + hp[j]));
          const r = sigmoid(fround(xp[U + j] + hp[U + j]));
          const n = tanh(fround(xp[2 * U + j] + fround(r * fround(hp[2 * U + j] + cb[j]))));
          h[j] = fround(fround(z * h[j]) + fround(fround(1 - z) * n));
        }
      } else {
        // reset_after=False: the candidate's product is of r * h.
        product(this.recurrent, 0, 2 * U, U, h, hp);
        const rh = this.resetH, z = new Float32Array(U);
        for (let j = 0; j < U; j++) {
          z[j] = sigmoid(fround(xp[j] + hp[j]));
          rh[j] = fround(sigmoid(fround(xp[U + j] + hp[U + j])) * h[j]);
        }
        product(this.recurrent, 2 * U, U, U, rh, hp);
        for (let j = 0; j < U; j++) {
          const n = tanh(fround(xp[2 * U + j] + hp[j]));
          h[j] = fround(fround(z[j] * h[j]) + fround(fround(1 - z[j]) * n));
        }
      }
      return h;
    }
  }

  function decodeBase64(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes.buffer;
  }

  class Model {
    /**
     * A model from its export: model.json's object and weights.bin's bytes.
     * @param {object} meta model.json.
     * @param {ArrayBuffer} buffer weights.bin (float32, little-endian).
     */
    constructor(meta, buffer) {
      if (meta.format !== "rnnstep-web" || meta.version !== 1) {
        throw new RnnstepError("model", "not an rnnstep web export (format " +
          describe(meta.format) + " version " + describe(meta.version) + ")");
      }
      const tensors = {};
      for (const [name, t] of Object.entries(meta.tensors)) {
        const size = t.shape.reduce((a, b) => a * b, 1);
        if (t.offset + 4 * size > buffer.byteLength) {
          throw new RnnstepError("model", `weights file too short for ${name}`);
        }
        tensors[name] = new Float32Array(buffer, t.offset, size);
      }
      this.meta = meta;
      this.vocab = meta.vocab.slice();
      this.vocabSize = meta.vocab.length;
      this.hasUnk = meta.has_unk;
      this.window = meta.window || 0;
      this.ids = new Map(this.vocab.map((c, i) => [c, i]));
      if (this.hasUnk) this.ids.delete(this.vocab[0]);
      this.layers = meta.layers.map((spec, i) => new Layer(spec, tensors, i));
      this.table = tensors.input_table;
      this.dense = kernelOf(tensors, "dense_kernel_t", this.layers[this.layers.length - 1].units);
      this.denseBias = tensors.dense_bias;
      this.options = new Map(meta.options.map((o) => [o.name, o]));
      this.last = this.layers[this.layers.length - 1].units;
    }

    /** The all-zero state: one {h} (LSTM: {h, c}) of Float32Array per layer. */
    zeroState() { return this.layers.map((layer) => layer.zeroState()); }

    /**
     * Text to ids, refusing a character outside the vocabulary in one line.
     * @param {string} text
     * @param {string} what how the message names the text ("prompt").
     * @returns {number[]}
     */
    encode(text, what = "text") {
      if (typeof text !== "string") {
        throw new RnnstepError(what, `${what} must be a string, got ${describe(text)}`);
      }
      const out = [];
      let position = 0;
      for (const ch of text) {
        const id = this.ids.get(ch);
        if (id === undefined) {
          const code = ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
          throw new RnnstepError(what, `${what}: character ${JSON.stringify(ch)} ` +
            `(U+${code}) at position ${position} is not in the model's ` +
            "vocabulary; remove or replace it");
        }
        out.push(id);
        position++;
      }
      return out;
    }

    /** Ids to text. */
    decode(ids) { return Array.from(ids, (i) => this.vocab[i]).join(""); }

    // One id through the stack (state updated in place); returns logits.
    _advance(id, state, logits) {
      const width = this.layers[0].width;
      let x = this.layers[0].step(this.table.subarray(id * width, (id + 1) * width), state[0]);
      for (let i = 1; i < this.layers.length; i++) {
        x = this.layers[i].step(this.layers[i].project(x), state[i]);
      }
      if (logits) {
        product(this.dense, 0, this.vocabSize, this.last, x, logits);
        for (let v = 0; v < this.vocabSize; v++) logits[v] = fround(logits[v] + this.denseBias[v]);
      }
      return logits;
    }

    _copyState(state) {
      if (state === undefined || state === null) return this.zeroState();
      if (!Array.isArray(state) || state.length !== this.layers.length) {
        throw new RnnstepError("state", `state must be null or a list of ${this.layers.length} ` +
          "layer states ({h} or, for an LSTM, {h, c})");
      }
      return state.map((s, i) => {
        const layer = this.layers[i], out = layer.zeroState();
        for (const name of Object.keys(out)) {
          if (!s || !s[name] || s[name].length !== layer.units) {
            throw new RnnstepError("state", `state[${i}].${name} must hold ${layer.units} numbers`);
          }
          out[name].set(s[name]);
        }
        return out;
      });
    }

    /**
     * Runs ids (or a string) through the stack from a state.
     * @param {number[]|string} ids the ids in order (at least one).
     * @param {Array|null} state one {h} / {h, c} per layer; null: zeros.
     * @returns {{logits: Float32Array, state: Array}} the logits after the
     *   last id and the new state (the state passed in is left unchanged).
     * @throws {RnnstepError} an id out of range or a bad state.
     */
    step(ids, state = null) {
      if (typeof ids === "string") ids = this.encode(ids, "ids");
      if (typeof ids === "number") ids = [ids];
      if (!ids || typeof ids.length !== "number" || ids.length === 0) {
        throw new RnnstepError("ids", "ids must be a non-empty list of ids or a string");
      }
      for (const id of ids) {
        if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
          throw new RnnstepError("ids", `ids must be integers in [0, ${this.vocabSize}), got ${describe(id)}`);
        }
      }
      const next = this._copyState(state), logits = new Float32Array(this.vocabSize);
      for (let t = 0; t < ids.length; t++) this._advance(ids[t], next, t === ids.length - 1 ? logits : null);
      return {logits, state: next};
    }

    // The logits for the next id after `history`, from the last `window` ids
    // from a zero state (window.py's result; here naively, window steps).
    _windowLogits(history, window, logits) {
      const state = this.zeroState();
      for (let p = Math.max(0, history.length - window); p < history.length; p++) {
        this._advance(history[p], state, p === history.length - 1 ? logits : null);
      }
      return logits;
    }

    /**
     * Checks generate's arguments as rnnstep.generate does (same words).
     * @returns {object} the settings.
     * @throws {RnnstepError} one line, naming the argument.
     */
    _settings(prompt, numChars, options) {
      if (options === undefined || options === null) options = {};
      if (typeof options !== "object" || Array.isArray(options)) {
        throw new RnnstepError("options", `options must be an object, got ${describe(options)}`);
      }
      const known = [...this.options.keys(), "stop", "seed"];
      for (const name of Object.keys(options)) {
        if (this.meta.refused_options[name]) {
          throw new RnnstepError(name, `${name}: ${this.meta.refused_options[name]}`);
        }
        if (!known.includes(name)) {
          throw new RnnstepError(name, `unknown option ${JSON.stringify(name)}; the options ` +
            `are ${known.join(", ")}`);
        }
      }
      const s = {};
      for (const [name, o] of this.options) {
        let value = options[name];
        if (value === undefined || value === null) value = o.default;
        if (value === null) { s[name] = null; continue; }  // window: the model's.
        if (!holds(o, value)) {
          throw new RnnstepError(name, `${name} must be ${o.words}, got ${describe(options[name])}`);
        }
        s[name] = o.dtype === "float32" ? fround(value) : value;
      }
      if (s.window === null) s.window = this.window;
      const promptIds = this.encode(prompt, "prompt");
      if (!promptIds.length) {
        throw new RnnstepError("prompt", "prompt is empty; give at least one character");
      }
      if (!Number.isInteger(numChars) || numChars < 0 || numChars >= 2 ** 31) {
        throw new RnnstepError("numChars", "numChars must be a non-negative integer below 2**31, " +
          `got ${describe(numChars)}`);
      }
      let stops = options.stop;
      if (stops === undefined || stops === null) stops = [];
      else if (typeof stops === "string") stops = [stops];
      if (!Array.isArray(stops) || !stops.every((x) => typeof x === "string")) {
        throw new RnnstepError("stop", `stop must be a string or a list of strings, got ${describe(options.stop)}`);
      }
      s.stops = stops.map((text) => {
        if (!text) throw new RnnstepError("stop", "a stop string is empty; give at least one character");
        try {
          return this.encode(text, "stop");
        } catch (e) {
          throw new RnnstepError("stop", `stop string ${JSON.stringify(text)} can never be generated: ` +
            e.message.replace(/^stop: /, ""));
        }
      });
      s.key = rowKey(checkSeed(options.seed), 0);
      s.promptIds = promptIds;
      return s;
    }

    /**
     * The characters of a continuation, one at a time (synchronously).
     * @param {string} prompt at least one character of the vocabulary.
     * @param {number} numChars characters to generate.
     * @param {object} options temperature, top_k, top_p, min_p, typical_p,
     *   repetition_penalty, frequency_penalty, presence_penalty,
     *   repetition_window, no_repeat_ngram_size, window,
     *   stop (a string or a list), seed (null: random).
     * @throws {RnnstepError} a bad argument, before anything is generated.
     */
    * characters(prompt, numChars, options) {
      const s = this._settings(prompt, numChars, options);
      const V = this.vocabSize, history = s.promptIds.slice();
      const logits = new Float32Array(V), scores = new Float32Array(V);
      const bits = new Uint32Array(V);
      const state = this.zeroState();
      if (!s.window) {
        for (let t = 0; t < history.length; t++) {
          this._advance(history[t], state, t === history.length - 1 ? logits : null);
        }
      }
      // The repetition penalty's counts over its window (processors.start).
      const counts = new Int32Array(V);
      const first = s.repetition_window > 0 ? history.length - s.repetition_window : 0;
      for (let p = Math.max(first, 0); p < history.length; p++) counts[history[p]]++;
      // The frequency and presence penalties' counts: the continuation's ids.
      const generated = new Int32Array(V);
      const stops = s.stops;
      for (let t = 0; t < numChars; t++) {
        if (s.window) this._windowLogits(history, s.window, logits);
        const id = this._choose(logits, scores, bits, s, history, counts, generated, t);
        // processors.append: the window's counts follow the new id.
        const leaving = history.length - s.repetition_window;
        history.push(id);
        counts[id]++;
        generated[id]++;
        if (s.repetition_window > 0 && leaving >= 0) counts[history[leaving]]--;
        yield this.vocab[id];
        if (stops.length && this._stopped(history, s.promptIds.length, stops)) return;
        if (!s.window && t + 1 < numChars) this._advance(id, state, logits);
      }
    }

    // Whether the continuation (not the prompt) now ends with a stop string.
    _stopped(history, start, stops) {
      for (const stop of stops) {
        const from = history.length - stop.length;
        if (from < start) continue;
        let same = true;
        for (let i = 0; i < stop.length && same; i++) same = history[from + i] === stop[i];
        if (same) return true;
      }
      return false;
    }

    // pipeline.choose for one row, in pipeline.tails' order.
    _choose(logits, scores, bits, s, history, counts, generated, step) {
      const V = this.vocabSize;
      scores.set(logits);
      if (this.hasUnk) scores[0] = -Infinity;  // The [UNK] ban.
      const theta = s.repetition_penalty;
      if (theta !== 1) {
        for (let v = 0; v < V; v++) {
          if (counts[v] > 0) scores[v] = scores[v] > 0 ? fround(scores[v] / theta) : fround(scores[v] * theta);
        }
      }
      // OpenAI's penalties, in vLLM's order: frequency, then presence.
      const f = s.frequency_penalty, p = s.presence_penalty;
      if (f !== 0) {
        for (let v = 0; v < V; v++) scores[v] = fround(scores[v] - fround(f * generated[v]));
      }
      if (p !== 0) {
        for (let v = 0; v < V; v++) if (generated[v] > 0) scores[v] = fround(scores[v] - p);
      }
      if (s.no_repeat_ngram_size > 0) banNgrams(scores, history, s.no_repeat_ngram_size);
      if (s.temperature === 0) return firstMax(scores);
      const t = s.temperature;
      for (let v = 0; v < V; v++) {
        const l = scores[v];
        if (l > -Infinity) scores[v] = Math.min(Math.max(fround(l / t), -LOGIT_LIMIT), LOGIT_LIMIT);
      }
      if (s.top_k > 0 && s.top_k < V) topK(scores, s.top_k);
      if (s.top_p < 1) topP(scores, s.top_p);
      if (s.min_p > 0) minP(scores, s.min_p);
      if (s.typical_p < 1) typical(scores, s.typical_p);
      noiseBits(s.key, step, V, bits);
      for (let v = 0; v < V; v++) scores[v] = fround(scores[v] + gumbelOf(bits[v]));
      return firstMax(scores);
    }

    /**
     * A continuation (the prompt not included).
     * @param {string} prompt
     * @param {number} numChars
     * @param {object} options see `characters`.
     * @returns {string}
     * @throws {RnnstepError} a bad argument.
     */
    generate(prompt, numChars, options = {}) {
      let text = "";
      for (const ch of this.characters(prompt, numChars, options)) text += ch;
      return text;
    }

    /**
     * The continuation as it comes: an async iterator of characters, yielding
     * to the event loop every `everyMs` milliseconds so a page can draw.
     * Arguments are checked before the first character.
     */
    stream(prompt, numChars, options = {}, everyMs = 16) {
      const chars = this.characters(prompt, numChars, options);
      const first = chars.next();  // Checks the arguments now, synchronously.
      return (async function* () {
        let next = first, since = performance.now();
        while (!next.done) {
          yield next.value;
          if (performance.now() - since > everyMs) {
            await new Promise((resolve) => setTimeout(resolve, 0));
            since = performance.now();
          }
          next = chars.next();
        }
      })();
    }
  }

  // ---- The decoding steps (sampling.py, processors.py), one row. ---------

  function firstMax(scores) {
    let top = -Infinity, index = -1;
    for (let v = 0; v < scores.length; v++) {
      if (scores[v] > top) { top = scores[v]; index = v; }
    }
    if (index >= 0) return index;
    for (let v = 0; v < scores.length; v++) if (scores[v] === top) return v;
    return scores.length - 1;  // NaN everywhere, as sampling.first_max_index.
  }

  function descending(scores) {
    return Float32Array.from(scores).sort().reverse();
  }

  function keepAtLeast(scores, threshold) {
    for (let v = 0; v < scores.length; v++) if (!(scores[v] >= threshold)) scores[v] = -Infinity;
  }

  // Softmax in float32 (each op rounded).
  function softmax(x) {
    let top = -Infinity;
    for (const v of x) if (v > top) top = v;
    const out = new Float32Array(x.length);
    let sum = 0;
    for (let i = 0; i < x.length; i++) { out[i] = fround(Math.exp(fround(x[i] - top))); sum = fround(sum + out[i]); }
    for (let i = 0; i < x.length; i++) out[i] = fround(out[i] / sum);
    return out;
  }

  function topK(scores, k) {
    keepAtLeast(scores, descending(scores)[k - 1]);
  }

  function topP(scores, p) {
    const ordered = descending(scores), probs = softmax(ordered);
    let before = 0, kept = 0;
    for (let i = 0; i < ordered.length; i++) {
      if (before < p) kept++;
      before = fround(before + probs[i]);
    }
    keepAtLeast(scores, ordered[Math.max(kept, 1) - 1]);
  }

  function minP(scores, minP) {
    let top = -Infinity;
    for (const v of scores) if (v > top) top = v;
    keepAtLeast(scores, fround(top + fround(Math.log(minP))));
  }

  function typical(scores, typicalP) {
    const V = scores.length;
    let top = -Infinity;
    for (const v of scores) if (v > top) top = v;
    let sum = 0;
    for (const v of scores) sum = fround(sum + fround(Math.exp(fround(v - top))));
    const logSum = fround(Math.log(sum)), logP = new Float32Array(V);
    let entropy = 0;
    for (let v = 0; v < V; v++) {
      logP[v] = fround(fround(scores[v] - top) - logSum);
      const p = fround(Math.exp(logP[v]));
      if (p > 0) entropy = fround(entropy + fround(p * logP[v]));
    }
    entropy = -entropy;
    const atypical = new Float32Array(V);
    for (let v = 0; v < V; v++) atypical[v] = Math.abs(fround(-logP[v] - entropy));
    const order = Array.from({length: V}, (_, i) => i).sort((a, b) => atypical[a] - atypical[b] || a - b);
    const mass = softmax(Float32Array.from(order, (i) => scores[i]));
    let below = 0, cumulative = 0;
    for (let i = 0; i < V; i++) { cumulative = fround(cumulative + mass[i]); if (cumulative < typicalP) below++; }
    const threshold = atypical[order[Math.min(below, V - 1)]];
    for (let v = 0; v < V; v++) if (atypical[v] > threshold) scores[v] = -Infinity;
  }

  // processors.ngram_ban: -inf on each id that would complete an n-gram
  // already in prompt + continuation.
  function banNgrams(scores, history, n) {
    const L = history.length;
    for (let j = 0; j + n - 1 < L; j++) {
      let match = true;
      for (let k = 0; k < n - 1 && match; k++) match = history[j + k] === history[L - n + 1 + k];
      if (match) scores[history[j + n - 1]] = -Infinity;
    }
  }

  // ---- Loading. -----------------------------------------------------------

  let current = null;

  /** A model from model.json's object and weights.bin's bytes. */
  function fromData(meta, weights) {
    const buffer = typeof weights === "string" ? decodeBase64(weights)
      : weights instanceof ArrayBuffer ? weights : weights.buffer.slice(
        weights.byteOffset, weights.byteOffset + weights.byteLength);
    current = new Model(meta, buffer);
    return current;
  }

  /**
   * Fetches an export (model.json and weights.bin) from a URL: its directory
   * or its model.json.
   * @returns {Promise<Model>}
   */
  async function load(url) {
    const base = new URL(String(url), globalThis.location ? location.href : undefined);
    const metaUrl = base.pathname.endsWith(".json") ? base
      : new URL("model.json", base.href.endsWith("/") ? base : base.href + "/");
    const metaResponse = await fetch(metaUrl);
    if (!metaResponse.ok) throw new RnnstepError("url", `${metaUrl}: HTTP ${metaResponse.status}`);
    const meta = await metaResponse.json();
    const weightsUrl = new URL(meta.weights, metaUrl);
    const weightsResponse = await fetch(weightsUrl);
    if (!weightsResponse.ok) throw new RnnstepError("url", `${weightsUrl}: HTTP ${weightsResponse.status}`);
    return fromData(meta, await weightsResponse.arrayBuffer());
  }

  function loaded() {
    if (!current) throw new RnnstepError("model", "no model loaded; call load(url) first");
    return current;
  }

  return {
    load, fromData, Model, RnnstepError,
    generate: (prompt, numChars, options) => loaded().generate(prompt, numChars, options),
    stream: (prompt, numChars, options) => loaded().stream(prompt, numChars, options),
    step: (ids, state) => loaded().step(ids, state),
    // The noise, for tests and for anyone checking it against sampling.py.
    noise: {fmix32, rowKey, noiseBits, uniformOf, gumbelOf},
  };
})();
