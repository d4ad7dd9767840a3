// convert_o200k.mjs — writes o200k_base.tiktoken (OpenAI's rank file format: one line per
// mergeable token, "<base64 bytes> <rank>") from the o200k_base ranks that the `tiktoken` npm
// package ships as JSON. muser reads that file in src/vocab_o200k.c and derives the GGUF merges
// there. Usage:
//   npm install --prefix /tmp/tk tiktoken
//   node data/tokenizers/convert_o200k.mjs /tmp/tk/node_modules/tiktoken/encoders/o200k_base.json \
//        data/tokenizers/o200k_base.tiktoken
import { readFileSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";

const [src, dst] = process.argv.slice(2);
if (!src || !dst) {
  console.error("usage: node convert_o200k.mjs o200k_base.json OUT.tiktoken");
  process.exit(2);
}
const enc = JSON.parse(readFileSync(src, "utf8"));
// The npm JSON packs the ranks as "! <first rank> tok tok ...": each "!" opens a run of
// consecutive ranks starting at the number after it; tokens are base64 of their bytes.
const words = enc.bpe_ranks.split(/\s+/).filter((w) => w.length);
const lines = [];
let rank = -1;
for (let i = 0; i < words.length; i++) {
  if (words[i] === "!") {
    rank = Number(words[++i]);
    continue;
  }
  if (rank < 0) throw new Error("bpe_ranks does not start with '! <rank>'");
  lines.push(`${words[i]} ${rank++}`);
}
const text = lines.join("\n") + "\n";
writeFileSync(dst, text);
const sha = createHash("sha256").update(text).digest("hex");
console.log(`${dst}: ${lines.length} ranks, sha256 ${sha}`);
console.log(`specials in the npm data: ${JSON.stringify(enc.special_tokens)}`);
