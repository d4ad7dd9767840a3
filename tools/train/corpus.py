#!/usr/bin/env python3
"""corpus.py — build the training corpus for the default model from public-domain English text
shipped in Debian packages (run on the Debian machine; the result travels to the GPU machine).

Sources (install: apt-get install bible-kjv-text jargon-text fortunes dict-devil):
  bible-kjv-text  King James Version (public domain)          one document per chapter
  jargon-text     The Jargon File 4.4.7 (public domain)       one document per entry
  fortunes        fortune-mod's fortunes (various, freely redistributable; see the package copyright)
  dict-devil      Ambrose Bierce, The Devil's Dictionary (public domain)  one document per entry

Documents are separated by the line "<|endoftext|>". Output: corpus.txt (UTF-8).
usage: corpus.py OUT_DIR
"""
import gzip, os, re, subprocess, sys, unicodedata

SEP = "\n<|endoftext|>\n"

BOOKS = None  # discovered from the bible tool's verse references


def clean(s):
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\t", " ").replace("\r", "")
    s = re.sub(r"[ ]{2,}", " ", s)
    return s.strip()


def kjv():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                         check=True).stdout
    docs, cur, cur_key = [], [], None
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if m:
            key = (m.group(1), m.group(2))
            if key != cur_key and cur:
                docs.append(" ".join(cur))
                cur = []
            cur_key = key
            cur.append(m.group(4).strip())
        elif line.strip() and cur:
            cur[-1] += " " + line.strip()  # wrapped continuation
    if cur:
        docs.append(" ".join(cur))
    return [clean(d) for d in docs]


def jargon():
    text = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8",
                     errors="replace").read()
    # Drop box-drawing tables, keep prose paragraphs; entries start at column 0 with "Name:" style.
    lines = [l for l in text.splitlines() if not re.search(r"[\u2500-\u257f]", l)]
    paras, cur = [], []
    for l in lines:
        if not l.strip():
            if cur:
                paras.append(" ".join(x.strip() for x in cur))
                cur = []
        else:
            cur.append(l)
    if cur:
        paras.append(" ".join(x.strip() for x in cur))
    # group paragraphs into documents of ~2 KB
    docs, cur, n = [], [], 0
    for p in paras:
        p = clean(p)
        if len(p) < 40:
            continue
        cur.append(p)
        n += len(p)
        if n > 2000:
            docs.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def fortunes():
    d = "/usr/share/games/fortunes"
    docs = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if "." in name or os.path.islink(p) or not os.path.isfile(p):
            continue
        if name in ("ascii-art", "art"):
            continue
        text = open(p, encoding="utf-8", errors="replace").read()
        for f in text.split("\n%\n"):
            f = clean(f)
            if len(f) > 20:
                docs.append(f)
    return docs


def devil():
    text = gzip.open("/usr/share/dictd/devil.dict.dz", "rt", encoding="utf-8",
                     errors="replace").read()
    entries = re.split(r"\n\n(?=[A-Z][A-Z' -]+, [a-z]+\.)", text)
    return [clean(e) for e in entries if re.match(r"^[A-Z][A-Z' -]+, [a-z]+\.", e.strip())]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    parts = {"kjv": kjv(), "jargon": jargon(), "fortunes": fortunes(), "devil": devil()}
    docs = []
    for name, ds in parts.items():
        print(f"{name}: {len(ds)} documents, {sum(len(x) for x in ds)/1e6:.2f} MB", file=sys.stderr)
        docs.extend(ds)
    with open(os.path.join(out_dir, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(SEP.join(docs))
        f.write("\n")


if __name__ == "__main__":
    main()
