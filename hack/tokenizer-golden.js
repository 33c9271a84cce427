// Regenerates tokenizer/testdata/golden: a deterministic corpus and, per
// model, the token ids that @lenml/tokenizers (a fork of transformers.js, an
// implementation independent of ours) gives for it, plus chat-template
// renderings where its Jinja engine can render the model's template.
// Run through hack/tokenizer-golden.sh.
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const crypto = require("crypto");

const [modelsDir, outDir, npmDir] = process.argv.slice(2);
const { TokenizerLoader } = require(path.join(npmDir, "node_modules/@lenml/tokenizers"));

// mulberry32: a small deterministic PRNG.
function rng(seed) {
  return function () {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// U+0085 and U+FEFF are left out: JavaScript's \s and Oniguruma's (Hugging
// Face tokenizers) disagree on them; tokenizer tests pin our behavior.
const fixed = [
  "", " ", "  ", "\n", "\r\n", "\t", "\n\n\n", " \n ", "  \n\n  ", "\r\n\r\n", "a\r\nb\r\n\r\nc",
  "Hello world", "Hello, world!", "hello   world", "hello\tworld", "  leading", "trailing  ", "trailing\n",
  "I'm sure you're right, it's DON'T and He'LL and we'VE and they'D", "'s 't 're 've 'm 'll 'd", "'S'T'RE'VE'M'LL'D", "ſ'ſ 'ſ",
  "1234567890", "3.14159 2.71828", "1,000,000.00", "-42 +17 1e10 0x1F", "١٢٣٤٥ ٦٧٨٩", "½ ¾ ² ³ Ⅻ ⅷ", "12345678901234567890123",
  "The year 2024 had 366 days.", "call +1 (555) 123-4567", "IPv4 192.168.0.1 and IPv6 ::1",
  "这是一个测试。我们正在测试分词器。", "日本語のテキストです。カタカナとひらがな。", "한국어 텍스트입니다.", "Привет, как дела?", "Γειά σου Κόσμε",
  "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "Ünïcödé çàfé naïve résumé", "straße STRASSE",
  "cafe\u0301 vs café", "e\u0301\u0302\u0303", "ﬁ ﬂ ﬀ", "Å Å Å", "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ", "\u00a0nbsp\u00a0 \u2003em\u2003 \u3000ideo\u3000",
  "👍", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag 🇺🇸🇯🇵", "👋🏽 wave 👋🏿", "😀😃😄😁😆😅🤣😂", "emoji🙂inside🙂words", "🧑‍💻 coding",
  "<|begin_of_text|>", "<|begin_of_text|>hello<|eot_id|>", "<|eot_id|><|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nhi",
  "<|im_start|>user\nhi<|im_end|>", "<|im_start|", "< |im_start| >", "<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>",
  "<think>\nreasoning\n</think>\n\n", "<tool_call>{\"a\":1}</tool_call>", "<s>[INST] hi [/INST]", "</s>", "<unk>", "<s><s>",
  "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>", "<｜User｜", "<|reserved_special_token_5|>", "<|fim_prefix|>x<|fim_suffix|>",
  "func main() {\n\tfmt.Println(\"hi\")\n}\n", "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}", "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
  "if (a && b || !c) { x += y; } else { x -= y; }", "#include <stdio.h>\nint main(void){return 0;}", "https://example.com/path?q=1&r=two#frag",
  "user@example.com", "C:\\Users\\name\\file.txt", "$ ls -la | grep '^d' > out.txt 2>&1", "...!!!???---___===+++", "((([[[{{{}}}]]])))",
  "a  b   c    d     e", " \t \t ", "word\n\n\n\nword", "line1\nline2\rline3\r\nline4", "\n\n \n \n", "x\u2028y\u2029z",
  "mixed中文and English混合text", "АБВ abc 123 ٤٥٦", "tab\tseparated\tvalues\n1\t2\t3", "CamelCaseWordsHere and snake_case_words",
  "don't stop", "DON'T STOP", "rock'n'roll", "it's-a me", "’curly’ “quotes”", "— – - ‐", "…", "•·°", "©®™", "€£¥₹₿",
];

const scripts = [
  "the quick brown fox jumps over the lazy dog", "Lorem ipsum dolor sit amet consectetur", "这是中文文本示例", "日本語とカタカナ",
  "한국어문장", "русский текст", "ελληνικά", "العربية", "עברית", "हिन्दी", "ไทย", "tiếng Việt", "ñandú",
];
const pieces = [
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000", ".", ",", "!", "?", "'s", "'ll", "'RE", "...", "--", "()", "{}",
  "[]", "<>", "\"", "#", "$", "%", "&", "*", "+", "=", "/", "\\", "|", "~", "`", "^", "@", "0", "7", "42", "123", "4567", "89012345",
  "3.14", "👍", "👨‍👩‍👧", "🇫🇷", "🏽", "é", "e\u0301", "ß", "ﬁ", "<|", "|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>",
  "<think>", "<｜User｜>", "_", "__init__", "0x", "\u200d", "\u200b",
];

function randomText(r) {
  const n = 1 + Math.floor(r() * 40);
  let s = "";
  for (let i = 0; i < n; i++) {
    if (r() < 0.45) {
      const src = scripts[Math.floor(r() * scripts.length)];
      const chars = Array.from(src);
      const a = Math.floor(r() * chars.length);
      const b = Math.min(chars.length, a + 1 + Math.floor(r() * 12));
      s += chars.slice(a, b).join("");
    } else {
      s += pieces[Math.floor(r() * pieces.length)];
    }
  }
  return s;
}

const r = rng(14);
const corpus = fixed.slice();
while (corpus.length < 560) corpus.push(randomText(r));

// bigText is corpus joined by "\n", repeated to 1 MiB and cut at a rune
// boundary (tokenizer.BigText rebuilds it the same way).
function bigText(texts) {
  const one = Buffer.from(texts.join("\n") + "\n", "utf8");
  const limit = 1 << 20;
  const buf = Buffer.alloc(limit + 4);
  let off = 0;
  while (off < limit) { off += one.copy(buf, off, 0, Math.min(one.length, limit - off)); }
  let cut = limit;
  while (cut > 0 && (buf[cut] & 0xc0) === 0x80) cut--;
  return buf.subarray(0, cut).toString("utf8");
}

function gz(file, obj) {
  fs.writeFileSync(path.join(outDir, file), zlib.gzipSync(Buffer.from(JSON.stringify(obj)), { level: 9 }));
}

// e2ePrompt is the prompt of the end-to-end test (kvevents): a few hundred
// tokens of mixed text.
const e2ePrompt = "You are helping me plan a trip. " + corpus.slice(11, 60).join(" ") + "\nWhat should I pack?";


// ---- multi-turn conversations (chat_<model>.json.gz) ----
// Requests as a client sends them (OpenAI messages, tools), the messages
// as vLLM hands them to the template (content joined into a string, tool
// call arguments parsed), and the rendering and ids the engine computes.

const turnPieces = [
  "Hello", " world", "\n", "\n\n", "  ", "What is 2+2?", "Ünïcödé", "é", "🙂", "日本語", "```go\nfunc f() {}\n```", "x", "1234567", "'s",
  " trailing ", "\t", "<|eot_id|>", "<|im_end|>", "<|im_start|>", "<tool_call>", "a  b", "{\"k\": [1, 2]}", "line1\nline2",
];
function turnText(r) {
  let s = "";
  const n = 1 + Math.floor(r() * 10);
  for (let i = 0; i < n; i++) s += turnPieces[Math.floor(r() * turnPieces.length)];
  return s;
}

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object",
    properties: { city: { type: "string", description: "The city, e.g. Paris" }, days: { type: "integer", minimum: 1 } }, required: ["city"] } } },
  { type: "function", function: { name: "search", description: "Search the web", parameters: { type: "object", properties: { q: { type: "string" } } } } },
];

// pyJSON is Python's json.dumps(x, ensure_ascii=False) for the values used
// here (no floats).
function pyJSON(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "[" + v.map(pyJSON).join(", ") + "]";
  if (typeof v === "object") return "{" + Object.keys(v).map((k) => JSON.stringify(k) + ": " + pyJSON(v[k])).join(", ") + "}";
  return JSON.stringify(v);
}

// vllmTool is tool.model_dump(): type, function {name, description, parameters}.
function vllmTool(t) {
  return { type: t.type, function: { name: t.function.name, description: t.function.description ?? null, parameters: t.function.parameters ?? null } };
}

// vllmMessage converts one message for a template that takes string content.
function vllmMessage(m) {
  let content = m.content;
  if (content === null || content === undefined) content = "";
  else if (Array.isArray(content)) content = content.map((p) => (typeof p === "string" ? p : p.text)).filter((t) => t).join("\n");
  const out = { role: m.role, content };
  if (m.role === "assistant") {
    if (m.tool_calls) out.tool_calls = m.tool_calls.map((c) => ({ id: c.id, function: { arguments: JSON.parse(c.function.arguments), name: c.function.name }, type: c.type }));
    const reasoning = m.reasoning ?? m.reasoning_content;
    if (reasoning !== undefined && reasoning !== null) { out.reasoning = reasoning; out.reasoning_content = reasoning; }
  }
  if (m.role === "tool" && "tool_call_id" in m) out.tool_call_id = m.tool_call_id;
  return out;
}

function conversation(r, i) {
  const msgs = [];
  const withTools = i % 3 === 1;
  if (i % 2 === 0) msgs.push({ role: "system", content: "You are a helpful assistant. " + turnText(r) });
  const turns = 1 + Math.floor(r() * 6);
  for (let t = 0; t < turns; t++) {
    if (r() < 0.3) msgs.push({ role: "user", content: [{ type: "text", text: turnText(r) }, { type: "text", text: turnText(r) }] });
    else msgs.push({ role: "user", content: turnText(r) });
    if (withTools && r() < 0.6) {
      const id = "call_" + i + "_" + t;
      msgs.push({ role: "assistant", content: null, tool_calls: [{ id, type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\", \"days\": " + (t + 1) + "}" } }] });
      msgs.push({ role: "tool", tool_call_id: id, content: "{\"temp\": " + (10 + t) + ", \"sky\": \"" + turnText(r).replace(/["\\\n\t]/g, " ") + "\"}" });
    }
    if (t < turns - 1) {
      if (r() < 0.3) msgs.push({ role: "assistant", content: turnText(r), reasoning_content: "Thinking: " + turnText(r) });
      else msgs.push({ role: "assistant", content: turnText(r) });
    }
  }
  const req = { messages: msgs };
  if (withTools) req.tools = tools;
  if (i % 5 === 3) req.chat_template_kwargs = { enable_thinking: false };
  return req;
}

// qwen3ChatML renders a converted conversation as Qwen 3's chat template
// does (its documented ChatML form with tools and thinking), for the
// template @lenml/tokenizers' Jinja cannot parse.
function qwen3ChatML(messages, tools, addGen, enableThinking) {
  let s = "";
  if (tools) {
    s += "<|im_start|>system\n";
    if (messages[0].role === "system") s += messages[0].content + "\n\n";
    s += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const t of tools) s += "\n" + pyJSON(t);
    s += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (messages[0].role === "system") {
    s += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  let multiStep = true, lastQuery = messages.length - 1;
  for (let k = messages.length - 1; k >= 0; k--) {
    const m = messages[k];
    if (multiStep && m.role === "user" && !(m.content.startsWith("<tool_response>") && m.content.endsWith("</tool_response>"))) { multiStep = false; lastQuery = k; }
  }
  const lstripNL = (x) => x.replace(/^\n+/, ""), rstripNL = (x) => x.replace(/\n+$/, "");
  messages.forEach((m, i) => {
    const last = i === messages.length - 1;
    if (m.role === "user" || (m.role === "system" && i > 0)) {
      s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role === "assistant") {
      let content = m.content, reasoning = "";
      if (m.reasoning_content !== undefined && m.reasoning_content !== null) reasoning = m.reasoning_content;
      else if (content.includes("</think>")) {
        const parts = content.split("</think>");
        reasoning = lstripNL(rstripNL(parts[0]).split("<think>").pop());
        content = lstripNL(parts[parts.length - 1]);
      }
      if (i > lastQuery && (last || reasoning)) s += "<|im_start|>" + m.role + "\n<think>\n" + lstripNL(rstripNL(reasoning)) + "\n</think>\n\n" + lstripNL(content);
      else s += "<|im_start|>" + m.role + "\n" + content;
      (m.tool_calls || []).forEach((tc, j) => {
        if ((j === 0 && content) || j > 0) s += "\n";
        const f = tc.function || tc;
        s += "<tool_call>\n{\"name\": \"" + f.name + "\", \"arguments\": " + (typeof f.arguments === "string" ? f.arguments : pyJSON(f.arguments)) + "}\n</tool_call>";
      });
      s += "<|im_end|>\n";
    } else if (m.role === "tool") {
      if (i === 0 || messages[i - 1].role !== "tool") s += "<|im_start|>user";
      s += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role !== "tool") s += "<|im_end|>\n";
    }
  });
  if (addGen) {
    s += "<|im_start|>assistant\n";
    if (enableThinking === false) s += "<think>\n\n</think>\n\n";
  }
  return s;
}

function chatGolden(model, tok, enc) {
  const r = rng(24);
  const out = [];
  for (let i = 0; i < 40; i++) {
    const req = conversation(r, i);
    const messages = req.messages.map(vllmMessage);
    const toolDicts = req.tools ? req.tools.map(vllmTool) : null;
    const kw = req.chat_template_kwargs || {};
    let rendered;
    if (model === "qwen3") rendered = qwen3ChatML(messages, toolDicts, true, kw.enable_thinking);
    else rendered = tok.apply_chat_template(messages, { tools: toolDicts, add_generation_prompt: true, tokenize: false, ...kw });
    out.push({ request: req, rendered, ids: enc(rendered) });
  }
  return out;
}

fs.mkdirSync(outDir, { recursive: true });
gz("corpus.json.gz", corpus);
const big = bigText(corpus);

for (const model of fs.readdirSync(modelsDir).sort()) {
  const dir = path.join(modelsDir, model);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: tj, tokenizerConfig: tc });
  const enc = (s) => Array.from(tok.encode(s, { add_special_tokens: false }));
  const ids = corpus.map(enc);
  const bigIDs = enc(big);
  const h = crypto.createHash("sha256");
  const b = Buffer.alloc(4 * bigIDs.length);
  bigIDs.forEach((v, i) => b.writeUInt32LE(v, 4 * i));
  h.update(b);
  // chat: what an engine renders and tokenizes for one user message, for
  // the first 120 corpus texts and the end-to-end prompt (last). Where
  // @lenml/tokenizers cannot render the model's template (Qwen 3's needs
  // [::-1]), the documented ChatML form is tokenized instead (rendered is
  // then left empty, so only the ids are compared).
  const chat = [];
  let renderError = "";
  for (const text of corpus.slice(0, 120).concat([e2ePrompt])) {
    let rendered = "", chatIDs;
    try {
      rendered = tok.apply_chat_template([{ role: "user", content: text }], { add_generation_prompt: true, tokenize: false });
      chatIDs = enc(rendered);
    } catch (e) {
      renderError = String(e.message || e).slice(0, 200);
      if (model !== "qwen3") break;
      chatIDs = enc("<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n");
    }
    chat.push({ text, rendered, ids: chatIDs });
  }
  gz(`${model}.json.gz`, { model, ids, big: { tokens: bigIDs.length, sha256: h.digest("hex") }, chat, renderError, e2ePrompt });
  if (model === "llama3" || model === "qwen3") {
    // Whole conversations, and completion prompts with the
    // post-processor's special tokens (add_special_tokens=True).
    const completion = corpus.slice(0, 60).map((text) => ({ text, ids: Array.from(tok.encode(text)) }));
    gz(`chat_${model}.json.gz`, { model, conversations: chatGolden(model, tok, enc), completion });
  } else if (model === "llama2") {
    gz(`chat_${model}.json.gz`, { model, conversations: [], completion: corpus.slice(0, 60).map((text) => ({ text, ids: Array.from(tok.encode(text)) })) });
  }
  console.error(`[tokenizer-golden] ${model}: ${corpus.length} texts, big ${bigIDs.length} tokens, ${chat.length} renderings${renderError ? " (render error: " + renderError + ")" : ""}`);
}
