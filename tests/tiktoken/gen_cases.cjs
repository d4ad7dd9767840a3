// gen_cases.cjs — test strings and tiktoken's o200k_base ids for them, written in the peer-test
// format muser reads with `muser tokenize --batch`: OUT.inp holds the strings separated by lines
// "__ggml_vocab_test__", OUT.out one line of ids per string. Strings come from a fixed list of
// hostile cases plus a seeded generator mixing scripts, digits, punctuation, contractions,
// whitespace runs and emoji, so the set is the same on every run.
//   node gen_cases.cjs NODE_MODULES_DIR OUT_PREFIX [N_RANDOM]
// Also writes OUT_PREFIX.special.{inp,out}: strings with special tokens, encoded with every
// special allowed (compare with `muser tokenize --special`).
const fs = require("fs");
const path = require("path");
const [modules, prefix, nArg] = process.argv.slice(2);
const { get_encoding } = require(path.join(modules, "tiktoken"));
const enc = get_encoding("o200k_base");
const nRandom = Number(nArg || 400);

const fixed = [
  "", " ", "  ", "\t", "\n", "\n\n\n", "\r\n", " \r\n \n\t ", "Hello world", " Hello world",
  "HELLO World hello", "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it",
  "We'Ve a'lL DON'T", "3", "33", "333", "3333", "12345678901234567890", "3.14159 2,718 1e-9",
  "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅", "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽",
  "我想在apple工作1314151天～", "日本語のテキストです。", "한국어 문장입니다", "нещо на Български",
  "Ελληνικά γράμματα", "עברית מימין לשמאל", "العربية نص", "हिन्दी पाठ", "កាន់តែពិសេសអាច",
  "Cửa Việt", "e\u0301 combining é", "ﬁ ligature Ⅻ ½ ²", "tab\tseparated\tvalues",
  "    indented\n        code();\n", "def f(x):\n    return x**2  # comment\n",
  "<html><body class=\"x\">text</body></html>", "https://example.com/a/b?c=d&e=f#g",
  "!!!!!!?????......", "''''''```````\"\"\"\"", "------=======", "a\u00a0b\u2003c\u3000d",
  "line\u2028sep\u2029para", "nel\u0085char", "ZERO\u200bWIDTH", "CamelCaseIdentifierName",
  "snake_case_identifier_name", "ALLCAPS WORDS HERE", "mIxEd CaSe", "x".repeat(300),
  "ab".repeat(200), " ".repeat(50) + "end", "\n".repeat(20) + "x", "abc/\n/def",
  "Ärger über Öl", "façade naïve coöperate", "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕", "1️⃣ 2️⃣ #️⃣",
];

// Deterministic PRNG (mulberry32).
let seed = 0x5eed1234;
function rnd() {
  seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const pieces = [
  "the", "The", "THE", "quick", "brown", "fox", "jumps", "über", "naïve", "Straße", "日本", "中文",
  "테스트", "Привет", "мир", "γειά", "שלום", "مرحبا", "नमस्ते", "ไทย", "🙂", "😀", "🦙", "👩‍💻",
  "❤️", "🇫🇷", "'s", "'t", "'re", "'LL", "'d", "’s", "0", "7", "42", "1234", "3.5", "1,000",
  "%", "$", "#", "@", "/", "\\", "(", ")", "[", "]", "{", "}", "...", "—", "–", "-", "_", "*",
  "\"", "'", "`", "~", "!", "?", ",", ".", ";", ":", "<", ">", "=", "+", "&", "|", "^",
];
const spaces = [" ", " ", " ", "", "", "  ", "\t", "\n", "\r\n", "\n\n", "   ", "\u00a0"];
const random = [];
for (let i = 0; i < nRandom; i++) {
  const n = 1 + Math.floor(rnd() * 12);
  let s = "";
  for (let k = 0; k < n; k++) s += pick(pieces) + pick(spaces);
  random.push(s);
}

function write(name, strings, allowSpecial) {
  const inp = strings.map((s) => s + "\n__ggml_vocab_test__\n").join("");
  const out = strings
    .map((s) => Array.from(allowSpecial ? enc.encode(s, "all") : enc.encode_ordinary(s)).join(" "))
    .join("\n") + "\n";
  fs.writeFileSync(name + ".inp", inp);
  fs.writeFileSync(name + ".out", out);
}
write(prefix, fixed.concat(random), false);
write(prefix + ".special", [
  "<|endoftext|>", "a<|endoftext|>b", "<|endofprompt|> x <|endoftext|>", "<|endoftext",
  "text <|endoftext|>\n<|endoftext|><|endoftext|>",
], true);
console.log(`${prefix}.inp: ${fixed.length + random.length} strings`);
