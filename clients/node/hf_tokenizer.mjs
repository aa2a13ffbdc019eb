// Loads the Hugging Face tokenizer files of an rpac export with
// transformers.js, offline, and checks that it encodes a text to the ids
// rpac gives and decodes them back to the text. Exits non-zero on any
// difference.
//
// usage: node hf_tokenizer.mjs EXPORT_DIR TEXT_FILE IDS_JSON
import { readFileSync } from "node:fs";
import path from "node:path";
import { env, AutoTokenizer } from "@huggingface/transformers";

const [dir, textFile, idsFile] = process.argv.slice(2);
if (!idsFile) {
  console.error("usage: node hf_tokenizer.mjs EXPORT_DIR TEXT_FILE IDS_JSON");
  process.exit(2);
}
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(path.resolve(dir)) + path.sep;

const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(dir)), { local_files_only: true });
const text = readFileSync(textFile, "utf8");
const want = JSON.parse(readFileSync(idsFile, "utf8"));

const got = tok.encode(text, { add_special_tokens: false });
let at = 0;
while (at < got.length && at < want.length && got[at] === want[at]) at++;
if (at < got.length || at < want.length) {
  const near = (a) => JSON.stringify(Array.from(a.slice(Math.max(0, at - 3), at + 5)));
  console.error(`encode: ${got.length} ids against rpac's ${want.length}; first difference at ${at}: ${near(got)} against ${near(want)}` +
    ` (text ${JSON.stringify(tok.decode(want.slice(Math.max(0, at - 3), at + 5)))})`);
  process.exit(1);
}
const back = tok.decode(want, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
if (back !== text) {
  let i = 0;
  while (i < back.length && back[i] === text[i]) i++;
  console.error(`decode: ${back.length} characters against ${text.length}; first difference at ${i}: ` +
    `${JSON.stringify(back.slice(i, i + 20))} against ${JSON.stringify(text.slice(i, i + 20))}`);
  process.exit(1);
}
console.log(`ok: ${want.length} ids, ${text.length} characters, encode and decode equal rpac's`);
