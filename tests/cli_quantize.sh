#!/usr/bin/env bash
# cli_quantize.sh — `muser quantize` end to end: every --type on a synth model (types checked
# with `muser inspect --json`), the mix rule on real tensor names, re-quantizing a quantized file,
# the ne0 fallbacks (q8_0 / f16) on a hand-written GGUF whose output is decoded by an independent
# Python reader (F16, Q8_0, Q4_K, Q6_K dequantized here from the ggml layout and compared with the
# f32 source), and the error paths: usage -> 2, unreadable input -> 1, no OUT or OUT.tmp left.
set -u
BIN=${MUSER_BIN:-}
[ -n "$BIN" ] && [ -x "$BIN" ] || { echo "SKIP: MUSER_BIN not set or not executable"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# ---- usage errors exit 2, unreadable input exits 1, nothing is left behind ----
"$BIN" quantize >/dev/null 2>&1; [ $? -eq 2 ] && ok "no args -> 2" || bad "no args"
"$BIN" quantize a b >/dev/null 2>&1; [ $? -eq 2 ] && ok "no --type -> 2" || bad "no --type"
"$BIN" quantize a b --type q5_k >/dev/null 2>&1; [ $? -eq 2 ] && ok "bad type -> 2" || bad "bad type"
"$BIN" quantize a b --type q4_k --bogus >/dev/null 2>&1; [ $? -eq 2 ] && ok "bad option -> 2" || bad "bad option"
"$BIN" quantize a b --type q4_k -t 0 >/dev/null 2>&1; [ $? -eq 2 ] && ok "bad threads -> 2" || bad "bad threads"
"$BIN" quantize --help | grep -q "usage: muser quantize" && ok "--help" || bad "--help"
err=$("$BIN" quantize "$TMP/missing.gguf" "$TMP/out.gguf" --type q4_k 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && ok "missing input -> 1, one line" \
    || bad "missing input: rc $rc: $err"
[ ! -e "$TMP/out.gguf" ] && [ ! -e "$TMP/out.gguf.tmp" ] && ok "no output left" || bad "output left behind"
printf 'GGUF\003\000\000\000garbage' > "$TMP/corrupt.gguf"
"$BIN" quantize "$TMP/corrupt.gguf" "$TMP/out.gguf" --type q8_0 >/dev/null 2>&1
[ $? -eq 1 ] && [ ! -e "$TMP/out.gguf" ] && ok "corrupt input -> 1" || bad "corrupt input"

# ---- a synth model through every type ----
if ! "$BIN" synth --preset tiny --type f32 -o "$TMP/tiny.gguf" >"$TMP/synth.log" 2>&1; then
    echo "SKIP: muser synth is not built: $(head -1 "$TMP/synth.log")"
    [ $fail -eq 0 ] && exit 77 || exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: python3 is needed to read inspect --json"
    [ $fail -eq 0 ] && exit 77 || exit 1
fi

# types.py FILE: "name type" per tensor, from inspect --json
types() {
    "$BIN" inspect --json "$1" | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tensors"]:
    print(t["name"], t["type"])'
}

# a bad output directory: exit 1, the input untouched
"$BIN" quantize "$TMP/tiny.gguf" "$TMP/nodir/out.gguf" --type q8_0 >/dev/null 2>&1
[ $? -eq 1 ] && ok "unwritable output -> 1" || bad "unwritable output"

for ty in f16 q8_0 q4_k q6_k mix; do
    if ! "$BIN" quantize "$TMP/tiny.gguf" "$TMP/tiny-$ty.gguf" --type $ty -t 2 2>"$TMP/q.log"; then
        bad "quantize --type $ty: $(tail -1 "$TMP/q.log")"; continue
    fi
    [ -e "$TMP/tiny-$ty.gguf.tmp" ] && bad "$ty: OUT.tmp left"
    types "$TMP/tiny-$ty.gguf" > "$TMP/types-$ty" || { bad "inspect $ty"; continue; }
    n_layer=$(grep -c '^blk\.[0-9]*\.attn_norm\.weight ' "$TMP/types-$ty")
    python3 - "$TMP/types-$ty" "$ty" "$n_layer" <<'EOF' && ok "types for --type $ty" || bad "types for --type $ty"
import re, sys
path, ty, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
bad = 0
for line in open(path):
    name, got = line.split()
    matrix = name.endswith(".weight") and not name.endswith("norm.weight")
    if not matrix:
        want = "f32"
    elif ty != "mix":
        want = ty
    else:
        m = re.match(r"blk\.(\d+)\.(ffn_down|attn_v)\.weight$", name)
        e = n // 8
        six = name == "output.weight" or (m is not None and (
            int(m.group(1)) < e or int(m.group(1)) >= 7 * n // 8 or (int(m.group(1)) - e) % 3 == 2))
        want = "q6_k" if six else "q4_k"
    if got != want:
        print("  %s: %s, want %s" % (name, got, want)); bad += 1
sys.exit(1 if bad else 0)
EOF
done
# metadata is carried over
"$BIN" inspect --json "$TMP/tiny-mix.gguf" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["architecture"] == "muse" and d["tokenizer"]["n_tokens"] > 0
assert d["metadata"]["general.file_type"] == 15' && ok "metadata copied, file_type 15" || bad "metadata"
# re-quantizing a quantized file (q8_0 -> q4_k) works and gives the same types as from f32
"$BIN" quantize "$TMP/tiny-q8_0.gguf" "$TMP/tiny-q8-q4.gguf" --type q4_k 2>/dev/null \
    && types "$TMP/tiny-q8-q4.gguf" | cmp -s - "$TMP/types-q4_k" && ok "q8_0 -> q4_k" || bad "q8_0 -> q4_k"
# same input, same bytes (deterministic, thread count does not matter)
"$BIN" quantize "$TMP/tiny.gguf" "$TMP/tiny-mix-1t.gguf" --type mix -t 1 2>/dev/null
cmp -s "$TMP/tiny-mix.gguf" "$TMP/tiny-mix-1t.gguf" && ok "deterministic across thread counts" \
    || bad "1 thread and 2 threads differ"
# the output can be written over an existing file (rename replaces it)
"$BIN" quantize "$TMP/tiny.gguf" "$TMP/tiny-mix-1t.gguf" --type q8_0 2>/dev/null \
    && types "$TMP/tiny-mix-1t.gguf" | cmp -s - "$TMP/types-q8_0" && ok "replace existing OUT" \
    || bad "replace existing OUT"

# ---- fallbacks and values, checked by an independent reader ----
python3 - "$BIN" "$TMP" <<'EOF' && ok "fallbacks and decoded values" || bad "fallbacks and decoded values"
import struct, subprocess, sys, random, math
BIN, TMP = sys.argv[1], sys.argv[2]
random.seed(7)

def f16(h):  # IEEE half bits -> float
    return struct.unpack("<e", struct.pack("<H", h))[0]

def write_gguf(path, kvs, tensors):  # tensors: (name, dims, type, raw bytes)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    def s(x):
        b = x.encode(); return struct.pack("<Q", len(b)) + b
    for k, v in kvs:
        out += s(k) + struct.pack("<I", 8) + s(v)
    off = 0; offs = []
    for name, dims, ty, raw in tensors:
        offs.append(off); off += (len(raw) + 31) // 32 * 32
    for (name, dims, ty, raw), o in zip(tensors, offs):
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, o)
    out += b"\0" * (-len(out) % 32)
    for name, dims, ty, raw in tensors:
        out += raw + b"\0" * (-len(raw) % 32)
    open(path, "wb").write(out)

def read_gguf(path):
    b = open(path, "rb").read(); p = 4
    ver, nt, nkv = struct.unpack_from("<IQQ", b, p); p += 20
    def rs():
        nonlocal p
        n, = struct.unpack_from("<Q", b, p); p += 8; v = b[p:p + n].decode(); p += n; return v
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32
    for _ in range(nkv):
        k = rs(); t, = struct.unpack_from("<I", b, p); p += 4
        if t == 8: rs()
        elif t == 9:
            at, n = struct.unpack_from("<IQ", b, p); p += 12
            for _ in range(n):
                if at == 8: rs()
                else: p += sizes[at]
        else:
            if k == "general.alignment": align, = struct.unpack_from("<I", b, p)
            p += sizes[t]
    infos = []
    for _ in range(nt):
        name = rs(); nd, = struct.unpack_from("<I", b, p); p += 4
        dims = struct.unpack_from("<%dQ" % nd, b, p); p += 8 * nd
        ty, off = struct.unpack_from("<IQ", b, p); p += 12
        infos.append((name, dims, ty, off))
    data = (p + align - 1) // align * align
    return {n: (d, t, b, data + o) for n, d, t, o in infos}

def dequant(ty, b, p, n):
    y = []
    if ty == 0: return list(struct.unpack_from("<%df" % n, b, p))
    if ty == 1: return [f16(h) for h in struct.unpack_from("<%dH" % n, b, p)]
    for blk in range(n // (32 if ty == 8 else 256)):
        if ty == 8:  # Q8_0
            d = f16(struct.unpack_from("<H", b, p)[0]); q = struct.unpack_from("<32b", b, p + 2)
            y += [d * v for v in q]; p += 34
        elif ty == 12:  # Q4_K
            d, dm = (f16(v) for v in struct.unpack_from("<2H", b, p)); s = b[p + 4:p + 16]
            sc = [s[j] & 63 for j in range(4)] + [(s[j + 8] & 15) | ((s[j] >> 6) << 4) for j in range(4)]
            mn = [s[j + 4] & 63 for j in range(4)] + [(s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4) for j in range(4)]
            qs = b[p + 16:p + 144]
            for e in range(256):
                byte = qs[32 * (e // 64) + e % 32]
                q = byte & 15 if e % 64 < 32 else byte >> 4
                y.append(d * sc[e // 32] * q - dm * mn[e // 32])
            p += 144
        elif ty == 14:  # Q6_K
            ql, qh = b[p:p + 128], b[p + 128:p + 192]
            sc = struct.unpack_from("<16b", b, p + 192); d = f16(struct.unpack_from("<H", b, p + 208)[0])
            for e in range(256):
                h, k, l = e // 128, (e % 128) // 32, e % 32
                lo = ql[64 * h + 32 * (k & 1) + l]; lo = lo >> 4 if k >= 2 else lo & 15
                q = lo | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)
                y.append(d * sc[e // 16] * (q - 32))
            p += 210
    return y

# [ne0, rows]: 512 -> q-type, 96 -> q8_0 fallback, 100 -> f16 fallback; a 1-D f16 norm -> f32
shapes = {"blk.0.attn_q.weight": (512, 3), "blk.0.attn_k.weight": (96, 4),
          "blk.0.attn_v.weight": (100, 2), "output.weight": (256, 2)}
src = {}
tensors = []
for name, (ne0, rows) in shapes.items():
    v = [random.gauss(0, 0.05) for _ in range(ne0 * rows)]
    src[name] = v
    tensors.append((name, (ne0, rows), 0, struct.pack("<%df" % len(v), *v)))
norm = [f16(struct.unpack("<H", struct.pack("<e", 1.0 + 0.01 * i))[0]) for i in range(64)]
tensors.append(("blk.0.attn_norm.weight", (64,), 1, struct.pack("<64e", *norm)))
src["blk.0.attn_norm.weight"] = norm
write_gguf(TMP + "/hand.gguf", [("general.architecture", "muse")], tensors)

want = {"q4_k": {"blk.0.attn_q.weight": 12, "output.weight": 12},
        "q6_k": {"blk.0.attn_q.weight": 14, "output.weight": 14},
        "mix": {"blk.0.attn_q.weight": 12, "output.weight": 14}}
bounds = {0: 1e-7, 1: 1e-3, 8: 0.01, 12: 0.1, 14: 0.03}
ok = True
for ty, w in want.items():
    r = subprocess.run([BIN, "quantize", TMP + "/hand.gguf", TMP + "/hand-%s.gguf" % ty, "--type", ty],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("  quantize", ty, r.stderr); ok = False; continue
    if "attn_k.weight: ne0 = 96" not in r.stderr or "attn_v.weight: ne0 = 100" not in r.stderr:
        print("  missing fallback notes:", r.stderr); ok = False
    w = dict(w, **{"blk.0.attn_k.weight": 8, "blk.0.attn_v.weight": 1, "blk.0.attn_norm.weight": 0})
    t = read_gguf(TMP + "/hand-%s.gguf" % ty)
    for name, wt in w.items():
        dims, got, b, p = t[name]
        n = 1
        for d in dims: n *= d
        if got != wt:
            print("  %s %s: type %d want %d" % (ty, name, got, wt)); ok = False; continue
        y, x = dequant(got, b, p, n), src[name]
        err = math.sqrt(sum((a - c) ** 2 for a, c in zip(y, x)) / sum(c * c for c in x))
        if not err <= bounds[got]:
            print("  %s %s: relative rms error %.4g > %g" % (ty, name, err, bounds[got])); ok = False
sys.exit(0 if ok else 1)
EOF

exit $fail
