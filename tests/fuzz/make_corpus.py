#!/usr/bin/env python3
"""make_corpus.py — writes the seed inputs of the fuzz targets into tests/fuzz/corpus/<reader>/: small valid files
of each format and edge cases next to them (empty, limits, known past bugs). Run it again after a format changes;
the seeds are committed, so CI never runs it.

    python3 tests/fuzz/make_corpus.py
"""
import base64
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def write(reader, name, data):
    folder = os.path.join(CORPUS, reader)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# ---- token shards (docs/formats.md) ----
def shard_bytes(documents, token_bytes, name="fuzz-tok", fingerprint="crc32c:0000abcd:42"):
    tokens = [t for d in documents for t in d]
    payload = b"".join(struct.pack("<H" if token_bytes == 2 else "<I", t) for t in tokens)
    payload += b"\0" * ((-len(payload)) % 8)
    starts, at = [], 0
    for d in documents:
        starts.append(at)
        at += len(d)
    starts.append(at)
    payload += b"".join(struct.pack("<Q", s) for s in starts)
    documents_offset = 256 + (len(tokens) * token_bytes + 7) // 8 * 8
    header = bytearray(256)
    header[0:8] = b"MTTOKENS"
    struct.pack_into("<IIIIQQQQQI", header, 8, 1, 256, token_bytes, 0, len(tokens), len(documents), 256,
                     documents_offset, 256 + len(payload), crc32c(payload))
    header[72:72 + len(name)] = name.encode()
    header[104:104 + len(fingerprint)] = fingerprint.encode()
    struct.pack_into("<I", header, 252, crc32c(bytes(header[:252])))
    return bytes(header) + payload


def shard_index(entries, token_bytes, vocab_size=70000):
    return json.dumps({
        "format": "meshtrain-token-shards", "version": 1,
        "tokenizer": {"name": "fuzz-tok", "kind": "tiktoken", "fingerprint": "crc32c:0000abcd:42",
                      "vocab_size": vocab_size, "end_of_text_id": 3},
        "token_bytes": token_bytes,
        "tokens": sum(e["tokens"] for e in entries), "documents": sum(e["documents"] for e in entries),
        "shards": entries, "sources": ["fuzz.txt"]}, indent=2) + "\n"


def shard_entry(file, documents, token_bytes, max_token=True):
    data = shard_bytes(documents, token_bytes)
    entry = {"file": file, "tokens": sum(len(d) for d in documents), "documents": len(documents),
             "bytes": len(data), "crc32c": "%08x" % struct.unpack_from("<I", data, 64)[0]}
    if max_token:
        entry["max_token"] = max(t for d in documents for t in d)
    return entry


def token_shards():
    # The harness's own shards (fuzz_token_shards.cpp writes the same documents).
    narrow = [[3, 10, 11, 12], [3, 65535]]
    wide = [[3, 69999]]
    write("token_shards", "index_uint16.json", shard_index([shard_entry("shard_00000.tok", narrow, 2)], 2))
    write("token_shards", "index_uint32_without_max_token.json",
          shard_index([shard_entry("shard_00001.tok", wide, 4, max_token=False)], 4))
    write("token_shards", "index_token_id_beyond_vocab.json",
          shard_index([shard_entry("shard_00000.tok", narrow, 2)], 2, vocab_size=1000))
    write("token_shards", "index_path_traversal.json",
          shard_index([dict(shard_entry("shard_00000.tok", narrow, 2), file="../shard_00000.tok")], 2))
    write("token_shards", "shard_uint16.tok", shard_bytes(narrow + [[3], [3, 7, 8]], 2))
    write("token_shards", "shard_uint32.tok", shard_bytes(wide + [[1, 2, 3, 4, 5]], 4))
    write("token_shards", "shard_empty.tok", shard_bytes([], 2))
    write("token_shards", "shard_empty_documents.tok", shard_bytes([[], [5], []], 2))
    write("token_shards", "shard_token_id_beyond_vocab.tok", shard_bytes([[3, 0xFFFFFFFF]], 4))


# ---- tokenizers ----
def gpt2_byte_alphabet():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(extra)
            extra += 1
    return table


BYTE_LEVEL_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r")]


def tokenizer_json(merges_as_pairs=False, sequence=False, ignore_merges=False, added_id=None):
    alphabet = gpt2_byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    eot_id = len(vocab) if added_id is None else added_id
    vocab["<|endoftext|>"] = eot_id
    if sequence:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": BYTE_LEVEL_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    else:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": eot_id, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab,
                  "merges": [[l, r] for l, r in MERGES] if merges_as_pairs else [f"{l} {r}" for l, r in MERGES]}},
        ensure_ascii=False)


def tokenizer_jsons():
    write("tokenizer_json", "gpt2_style.json", tokenizer_json())
    write("tokenizer_json", "llama3_style.json", tokenizer_json(merges_as_pairs=True, sequence=True,
                                                                ignore_merges=True))
    # The id that wrapped `resize(id + 1)` to 0 before ids were bounded.
    write("tokenizer_json", "added_id_4294967295.json", tokenizer_json(added_id=4294967295))


def tiktoken_file(extra=()):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    rank = 256
    for token in [b"he", b"ll", b"hell", b"hello", b" w", b"or"] + list(extra):
        lines.append(f"{base64.b64encode(token).decode()} {rank}")
        rank += 1
    return "\n".join(lines) + "\n"


def tiktokens():
    write("tiktoken", "r50k_like.tiktoken", tiktoken_file())
    write("tiktoken", "rank_4294967295.tiktoken", tiktoken_file() + "eHl6 4294967295\n")
    write("tiktoken", "no_trailing_newline.tiktoken", tiktoken_file().rstrip("\n"))


# ---- YAML config ----
def configs():
    with open(os.path.join(HERE, "..", "..", "configs", "defaults.yaml")) as f:
        write("config_yaml", "defaults.yaml", f.read())
    write("config_yaml", "overrides.yaml",
          "model:\n  name: llama-tiny\n  vocab_size: 256\n  layers: [1, 2, 3]\nici_mesh: {fsdp: 4, tensor: 1}\n"
          "seed: 42\nlr: 3.0e-4\nflag: true\nempty:\nanchor: &a {x: 1}\nalias: *a\n")
    # Past bugs (issue 34): an alias bomb (27 s to std::bad_alloc), flow nesting 100,000 deep, a non-scalar group.
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9))
    write("config_yaml", "alias_bomb.yaml", bomb)
    write("config_yaml", "nested_flow.yaml", "x: " + "[" * 100000 + "]" * 100000 + "\n")
    write("config_yaml", "defaults_not_scalar.yaml", "defaults:\n  - model: [a, b]\n  - {x: {y: z}}\nseed: 1\n")
    # Found by the mutation driver: a 50,000-byte key made the "closest known keys" edit distances run for minutes.
    write("config_yaml", "long_key.yaml", "model:\n  name: llama-tiny\n  layers: [1, 2, 3]\nici_me" + "]" * 50000 + "\n")


# ---- safetensors ----
def safetensors_bytes(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":"))
    if pad:
        text += " " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


def safetensors():
    write("safetensors", "f32_and_bf16.safetensors", safetensors_bytes([
        ("a", "F32", [2, 3], struct.pack("<6f", *range(6))),
        ("b", "BF16", [4], b"\x80\x3f" * 4),
        ("c", "I64", [], struct.pack("<q", -7))], metadata={"format": "pt"}))
    write("safetensors", "all_dtypes.safetensors", safetensors_bytes([
        (f"t_{d}", d, [2], b"\x01" * (2 * s)) for d, s in
        [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1), ("U8", 1),
         ("BOOL", 1)]]))
    write("safetensors", "empty_tensor.safetensors", safetensors_bytes([("e", "F32", [0, 5], b"")]))
    write("safetensors", "no_tensors.safetensors", safetensors_bytes([]))
    # Sizes whose byte count wraps to 0 in 64 bits (accepted before the multiplication was checked).
    write("safetensors", "overflowing_shape.safetensors",
          safetensors_bytes([("x", "F32", [4611686018427387904, 4], b"")]))


# ---- Hugging Face checkpoint index and marker, training state ----
TINY_LLAMA_TENSORS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight", "lm_head.weight"]


def checkpoint_files():
    # fuzz_safetensors_index.cpp writes its tiny Llama one tensor per file, in parameter order.
    count = len(TINY_LLAMA_TENSORS)
    weight_map = {name: f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i, name in enumerate(TINY_LLAMA_TENSORS)}
    write("safetensors_index", "valid.json",
          json.dumps({"metadata": {"total_size": 1024}, "weight_map": weight_map}, indent=2) + "\n")
    write("safetensors_index", "absolute_path.json",
          json.dumps({"metadata": {}, "weight_map": dict(weight_map, **{"lm_head.weight": "/etc/passwd"})}))
    write("safetensors_index", "parent_path.json",
          json.dumps({"weight_map": dict(weight_map, **{"model.norm.weight": "../model.safetensors"})}))

    # fuzz_checkpoint_marker.cpp's folder holds these two files.
    config, state = b'{"model_type": "llama"}\n', b'{"step": 1}\n'
    files = [{"name": "config.json", "bytes": len(config), "crc32c": crc32c(config)},
             {"name": "training_state.json", "bytes": len(state), "crc32c": crc32c(state)}]
    write("checkpoint_marker", "valid.json", json.dumps({"files": files}, indent=2) + "\n")
    write("checkpoint_marker", "missing_file.json",
          json.dumps({"files": files + [{"name": "optimizer-00001-of-00001.safetensors", "bytes": 8, "crc32c": 0}]}))
    write("checkpoint_marker", "parent_path.json",
          json.dumps({"files": [{"name": "../step-000001/config.json", "bytes": len(config),
                                 "crc32c": crc32c(config)}]}))
    write("checkpoint_marker", "wrong_types.json", json.dumps({"files": [{"name": 7, "bytes": "8", "crc32c": -1}]}))

    state = {"format": "meshtrain-training-state", "version": 1, "step": 20, "tokens_seen": 40960, "seed": 42,
             "data_state": {"epoch": 0, "step": 20, "samples": 1000}, "config_fingerprint": "3f2a9c1e",
             "config": {"optimizer.learning_rate": "0.003", "model.name": "llama-tiny", "block_size": "64"}}
    write("training_state", "valid.json", json.dumps(state, indent=2) + "\n")
    write("training_state", "huge_numbers.json",
          json.dumps(dict(state, step=18446744073709551615, seed=-1, tokens_seen=1e300)))


# ---- the control plane's messages (src/meshtrain/control/protocol.hpp) ----
def control_protocol():
    def field(b):
        return struct.pack("<I", len(b)) + b

    write("control_protocol", "set.bin", b"\x01" + field(b"meshtrain/joined/0") + field(b"1"))
    write("control_protocol", "get.bin", b"\x02" + struct.pack("<Q", 5000) + field(b"meshtrain/verdict"))
    write("control_protocol", "add.bin", b"\x03" + field(b"meshtrain/heartbeat/1") + struct.pack("<q", -1))
    write("control_protocol", "compare_set.bin", b"\x04" + field(b"meshtrain/abort") + field(b"") + field(b"1\nwhy"))
    write("control_protocol", "delete.bin", b"\x05" + field(b"k"))
    write("control_protocol", "check.bin", b"\x06" + struct.pack("<I", 2) + field(b"a") + field(b"b"))
    write("control_protocol", "num_keys.bin", b"\x07")
    write("control_protocol", "wait.bin", b"\x08" + struct.pack("<Q", 0) + struct.pack("<I", 1) + field(b"group/x"))
    write("control_protocol", "reply_value.bin", b"\x00" + field(b"value"))
    write("control_protocol", "huge_key_count.bin", b"\x06" + struct.pack("<I", 0xFFFFFFFF))
    write("control_protocol", "huge_length.bin", b"\x01" + struct.pack("<I", 0xFFFFFFF0) + b"k")


# ---- metrics.jsonl (what `meshtrain plot` and a resumed run read), prepare's JSONL, a Hugging Face config.json ----
def run_outputs():
    step = {"comm_bytes": {"allgather": 444544, "allreduce": 64}, "comm_s": 0.03, "compute_s": 0.07,
            "data_wait_s": 1.5e-06, "epoch": 0, "grad_norm": 2.5, "loss": 5.59, "lr": 0.0006, "mfu": 0.016,
            "step_time_s": 0.104, "tokens_per_s": 1226.0, "tokens_per_s_per_device": 613.0}
    lines = [json.dumps(dict(step, step=k, loss=5.6 - 0.1 * k)) for k in range(1, 6)]
    lines.insert(3, json.dumps({"step": 3, "eval_loss": 5.2, "eval_tokens": 4096, "eval_s": 0.2}))
    write("metrics_jsonl", "run.jsonl", "\n".join(lines) + "\n")
    write("metrics_jsonl", "torn_last_line.jsonl", "\n".join(lines[:2]) + "\n" + lines[2][:40])
    write("metrics_jsonl", "wrong_types.jsonl", json.dumps(dict(step, step="1", loss=None, comm_bytes=[1])) + "\n")
    write("metrics_jsonl", "huge_numbers.jsonl", json.dumps(dict(step, step=2 ** 63, loss=1e308, step_time_s=-1)) + "\n")

    documents = [{"text": "Call me Ishmael."}, {"text": "Some years ago\u2014never mind how long precisely", "id": 2},
                 {"text": ""}]
    write("prepare_jsonl", "documents.jsonl", "".join(json.dumps(d) + "\n" for d in documents))
    write("prepare_jsonl", "bad_lines.jsonl", '{"text": "ok"}\n[1, 2]\n{"text": 7}\n{"other": "x"}\nnot json\n')
    write("prepare_jsonl", "invalid_utf8.jsonl", b'{"text": "caf\xc3"}\n{"text": "\xff\xfe"}\n')

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 2048, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
              "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}
    write("hf_config", "llama_tiny.json", json.dumps(config, indent=2))
    write("hf_config", "llama3_rope.json", json.dumps(dict(config, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, eos_token_id=[1, 2])))
    write("hf_config", "mixtral.json", json.dumps(dict(config, model_type="mixtral", num_local_experts=4,
                                                      num_experts_per_tok=2, router_aux_loss_coef=0.02)))
    # Past bugs (issue 34): a float where an integer belongs was read as -2^63; a huge model allocated before any check.
    write("hf_config", "vocab_1e30.json", json.dumps(dict(config, vocab_size=1e30)))
    write("hf_config", "huge_model.json", json.dumps(dict(config, hidden_size=16384, intermediate_size=65536)))
    write("hf_config", "wrong_types.json", json.dumps(dict(config, num_hidden_layers="2", rope_theta=[1])))
    # Found by fuzz_hf_config: the default head_dim divided INT64_MIN by -1 (SIGFPE).
    write("hf_config", "heads_minus_one.json", json.dumps(dict(config, hidden_size=-2 ** 63, num_attention_heads=-1)))
    # Found by fuzz_metrics_jsonl: one line at a step of 9.2e15 made the axis ticks loop for ever.
    write("metrics_jsonl", "huge_step.jsonl", json.dumps(dict(step, step=9223372036854778, loss=1e308)) + "\n")
    write("hf_config", "nested.json", with_deep_value(json.dumps(dict(config, rope_scaling=DEEP_MARK))))
    write("metrics_jsonl", "nested.jsonl", lines[0] + "\n" + with_deep_value(json.dumps(dict(step, lr=DEEP_MARK))))
    write("prepare_jsonl", "nested.jsonl", with_deep_value(json.dumps({"text": "a", "meta": DEEP_MARK})) + "\n")


# ---- values nested deeper than any reader accepts (issue 34: a value nested 100,000 levels deep crashed every JSON
# reader: its error message dumped the value with nlohmann's recursive dump, and the stack overflowed) ----
DEEP_LEVELS = 50000  # 100 KB of brackets; the readers stop at json_read.hpp's kMaxJsonDepth (64)
DEEP_MARK = "@deeply-nested@"


def with_deep_value(text):
    """`text` with the JSON string DEEP_MARK replaced by an array nested DEEP_LEVELS deep."""
    return text.replace(json.dumps(DEEP_MARK), "[" * DEEP_LEVELS + "]" * DEEP_LEVELS)


def deep_nesting():
    narrow = [[3, 10, 11, 12], [3, 65535]]
    index = json.loads(shard_index([shard_entry("shard_00000.tok", narrow, 2)], 2))
    write("token_shards", "index_nested_sources.json", with_deep_value(json.dumps(dict(index, sources=DEEP_MARK))))
    tokenizer = json.loads(tokenizer_json())
    write("tokenizer_json", "nested_pre_tokenizer.json",
          with_deep_value(json.dumps(dict(tokenizer, pre_tokenizer=DEEP_MARK), ensure_ascii=False)))
    header = json.dumps({"x": {"dtype": "F32", "shape": DEEP_MARK, "data_offsets": [0, 0]}})
    text = with_deep_value(header)
    text += " " * ((-len(text)) % 8)
    write("safetensors", "nested_shape.safetensors", struct.pack("<Q", len(text)) + text.encode())
    write("safetensors_index", "nested_weight_map_value.json",
          with_deep_value(json.dumps({"weight_map": {"model.norm.weight": DEEP_MARK}})))
    write("checkpoint_marker", "nested_file_entry.json", with_deep_value(json.dumps({"files": [DEEP_MARK]})))
    write("training_state", "nested_step.json",
          with_deep_value(json.dumps({"format": "meshtrain-training-state", "version": 1, "step": DEEP_MARK})))


if __name__ == "__main__":
    shutil.rmtree(CORPUS, ignore_errors=True)
    token_shards()
    tokenizer_jsons()
    tiktokens()
    configs()
    safetensors()
    checkpoint_files()
    control_protocol()
    run_outputs()
    deep_nesting()
    for reader in sorted(os.listdir(CORPUS)):
        sizes = [os.path.getsize(os.path.join(CORPUS, reader, f)) for f in os.listdir(os.path.join(CORPUS, reader))]
        print(f"{reader}: {len(sizes)} seeds, largest {max(sizes)} bytes")
