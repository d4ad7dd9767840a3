"""gguf_io.py — a small GGUF v3 writer and reader for the training tools (numpy only).

Written from the GGUF layout (little-endian: magic, version, counts, key/values, tensor infos,
alignment padding, tensor data). The reader dequantizes F32, F16, BF16, Q8_0, Q4_K and Q6_K so
PyTorch can run the *released* (quantized) weights: an implementation independent of muser's C.
"""
import struct

try:
    import numpy as np
except ImportError:  # reading the directory and raw bytes (dflash_io.py's fingerprint) needs no numpy
    np = None

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16 = 0, 1, 8, 12, 14, 30
_SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
           T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
_BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_BF16: (1, 2), GGML_Q8_0: (32, 34),
          GGML_Q4_K: (256, 144), GGML_Q6_K: (256, 210),
          # sizes only (not dequantized here): Q4_0, Q4_1, Q5_0, Q5_1, Q8_1, Q2_K, Q3_K, Q5_K, Q8_K
          2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 9: (32, 36), 10: (256, 84),
          11: (256, 110), 13: (256, 176), 15: (256, 292)}


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(t, v):
    if t == T_STR:
        return _str(v)
    if t == T_ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        if et == T_STR:
            return out + b"".join(_str(x) for x in items)
        return out + np.asarray(items, dtype=np.dtype(_SCALAR[et][1:]).newbyteorder("<")).tobytes()
    return struct.pack(_SCALAR[t], v)


def write(path, kvs, tensors, alignment=32):
    """kvs: list of (key, type, value) — arrays as (T_ARR, (elem_type, list)).
    tensors: list of (name, np.ndarray) — float32 arrays stored F32 (ndim 1) or F16 (ndim 2),
    shape in PyTorch order (rows, cols); GGUF dims are written reversed (ne0 = cols)."""
    infos, blobs, off = [], [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        if arr.ndim == 1:
            data, typ = arr.astype("<f4").tobytes(), GGML_F32
        else:
            data, typ = arr.astype("<f2").tobytes(), GGML_F16
        dims = list(reversed(arr.shape))
        infos.append(_str(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off))
        blobs.append(data)
        off += len(data)
        off = (off + alignment - 1) // alignment * alignment
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
        for k, t, v in kvs:
            f.write(_str(k) + struct.pack("<I", t) + _value(t, v))
        for i in infos:
            f.write(i)
        pos = f.tell()
        f.write(b"\0" * ((alignment - pos % alignment) % alignment))
        for b in blobs:
            f.write(b)
            f.write(b"\0" * ((alignment - len(b) % alignment) % alignment))


class Reader:
    def __init__(self, path):
        self.buf = open(path, "rb").read()
        self.p = 0
        assert self.buf[:4] == b"GGUF", "bad magic"
        self.p = 4
        ver, nt, nkv = self._u("<IQQ")
        assert ver in (2, 3)
        self.kv = {}
        for _ in range(nkv):
            k = self._s()
            (t,) = self._u("<I")
            self.kv[k] = self._val(t)
        self.tinfo = []
        for _ in range(nt):
            name = self._s()
            (nd,) = self._u("<I")
            dims = [self._u("<Q")[0] for _ in range(nd)]
            typ, off = self._u("<IQ")
            self.tinfo.append((name, dims, typ, off))
        align = self.kv.get("general.alignment", 32)
        self.data = (self.p + align - 1) // align * align

    def _u(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.p)
        self.p += struct.calcsize(fmt)
        return v

    def _s(self):
        (n,) = self._u("<Q")
        s = self.buf[self.p:self.p + n].decode("utf-8")
        self.p += n
        return s

    def _val(self, t):
        if t == T_STR:
            return self._s()
        if t == T_ARR:
            et, n = self._u("<IQ")
            return [self._val(et) for _ in range(n)]
        return self._u(_SCALAR[t])[0]

    def tensor(self, name):
        """Dequantized float32 array in PyTorch order (rows, cols)."""
        for n, dims, typ, off in self.tinfo:
            if n == name:
                break
        else:
            raise KeyError(name)
        count = int(np.prod(dims))
        be, bb = _BLOCK[typ]
        raw = np.frombuffer(self.buf, dtype=np.uint8, count=count // be * bb,
                            offset=self.data + off)
        x = dequantize(typ, raw, count)
        return x.reshape(list(reversed(dims)))

    def names(self):
        return [t[0] for t in self.tinfo]

    def raw(self, i):
        """Tensor i of the directory (file order): (name, dims, ggml type, its data bytes)."""
        name, dims, typ, off = self.tinfo[i]
        count = 1
        for d in dims:
            count *= d
        be, bb = _BLOCK[typ]
        start = self.data + off
        return name, dims, typ, self.buf[start:start + count // be * bb]


def _f16(b):
    return b.copy().view("<f2").astype(np.float32)


def dequantize(typ, raw, count):
    if typ == GGML_F32:
        return raw.view("<f4").astype(np.float32)
    if typ == GGML_F16:
        return raw.view("<f2").astype(np.float32)
    if typ == GGML_BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if typ == GGML_Q8_0:
        b = raw.reshape(-1, 34)
        d = _f16(b[:, 0:2]).reshape(-1, 1)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if typ == GGML_Q4_K:
        b = raw.reshape(-1, 144)
        d = _f16(b[:, 0:2]).reshape(-1, 1)
        dmin = _f16(b[:, 2:4]).reshape(-1, 1)
        s = b[:, 4:16].astype(np.int32)
        qs = b[:, 16:144].astype(np.int32)
        sc = np.zeros((b.shape[0], 8), np.int32)
        mn = np.zeros((b.shape[0], 8), np.int32)
        for j in range(8):  # 6-bit scale/min unpacking
            if j < 4:
                sc[:, j] = s[:, j] & 63
                mn[:, j] = s[:, j + 4] & 63
            else:
                sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
                mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
        out = np.zeros((b.shape[0], 256), np.float32)
        for c in range(4):  # 64 values per 32 bytes: low nibbles, then high nibbles
            q = qs[:, 32 * c:32 * c + 32]
            for h, qq in ((0, q & 0xF), (1, q >> 4)):
                j = 2 * c + h
                out[:, 64 * c + 32 * h:64 * c + 32 * h + 32] = (
                    d * sc[:, j:j + 1] * qq - dmin * mn[:, j:j + 1])
        return out.reshape(-1)
    if typ == GGML_Q6_K:
        b = raw.reshape(-1, 210)
        ql = b[:, 0:128].astype(np.int32)
        qh = b[:, 128:192].astype(np.int32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[:, 208:210]).reshape(-1, 1)
        out = np.zeros((b.shape[0], 256), np.float32)
        for half in range(2):
            L = ql[:, 64 * half:64 * half + 64]
            H = qh[:, 32 * half:32 * half + 32]
            S = sc[:, 8 * half:8 * half + 8]
            base = 128 * half
            for l in range(32):
                i = l // 16
                q1 = ((L[:, l] & 0xF) | (((H[:, l] >> 0) & 3) << 4)) - 32
                q2 = ((L[:, l + 32] & 0xF) | (((H[:, l] >> 2) & 3) << 4)) - 32
                q3 = ((L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4)) - 32
                q4 = ((L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)) - 32
                out[:, base + l] = d[:, 0] * S[:, i + 0] * q1
                out[:, base + l + 32] = d[:, 0] * S[:, i + 2] * q2
                out[:, base + l + 64] = d[:, 0] * S[:, i + 4] * q3
                out[:, base + l + 96] = d[:, 0] * S[:, i + 6] * q4
        return out.reshape(-1)
    raise ValueError(f"unsupported ggml type {typ}")
