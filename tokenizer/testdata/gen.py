"""Goldens for the tokenizer package: what Hugging Face's `tokenizers` gives.

For every tokenizer.json under tokenizer/testdata/ and every line of the
corpus (tokenizer/testdata/corpus.jsonl.gz), the expected ids, type ids,
attention mask, special-tokens mask, offsets (in characters, as the Python
binding gives them) and the decoded text, written as gzip'd JSON lines to
tokenizer/testdata/golden-<name>.jsonl.gz. golden-options.jsonl.gz holds
the wp-cased tokenizer's encodings of pairs and batches under truncation and
padding options set by the caller. `go test ./tokenizer` reads them; it
never runs Python.

The tokenizers:
  minilm           the real sentence-transformers/all-MiniLM-L6-v2 tokenizer
                   (BERT uncased WordPiece; Apache-2.0), committed as is;
  gpt2             the real GPT-2 byte-level BPE (MIT), committed gzip'd; it
                   is rebuilt from GPT-2's vocab.json and merges.txt with
                   --gpt2-from DIR (they ship in the PyPI sdist
                   openai-whisper==20230124, under whisper/assets/gpt2);
  wp-cased         a WordPiece trained here on the corpus: BertNormalizer
                   without lowercasing, BertProcessing;
  wp-uncased       a WordPiece trained here: lowercasing, accents stripped,
                   Chinese characters off, TemplateProcessing, truncation to
                   24 and padding to a multiple of 8;
  bbpe             a byte-level BPE trained here (add_prefix_space, trimmed
                   offsets) with added tokens that use lstrip, rstrip and
                   single_word;
  llama2           a BPE trained here laid out as Llama 2's tokenizer.json:
                   Prepend("▁") and Replace(" ", "▁") normalizers, <0xNN>
                   byte fallback, fused <unk>, and the Replace, ByteFallback,
                   Fuse, Strip decoders;
  metaspace        the same model with a Metaspace pre-tokenizer and decoder
                   (the newer layout of Llama and Mistral tokenizers);
  llama3           a byte-level BPE trained here laid out as Llama 3's: the
                   Split regex of Llama 3, ByteLevel without its regex,
                   ignore_merges, a Sequence post-processor;
  ws-nfkc          NFKC and Lowercase normalizers, the Whitespace
                   pre-tokenizer, a BPE with "##" and "</w>", the BPE decoder;
  ws-nfd           Strip, NFD, StripAccents and Replace normalizers,
                   WhitespaceSplit, a WordPiece without post-processor.

Usage (with the pinned virtualenv of conformance/requirements.txt):
  python tokenizer/testdata/gen.py            # write the goldens
  python tokenizer/testdata/gen.py --check    # regenerate in memory, fail on any difference
  python tokenizer/testdata/gen.py --train    # retrain wp-cased, wp-uncased and bbpe first
  python tokenizer/testdata/gen.py --corpus   # rebuild the corpus first (changes every golden)
The trained tokenizers are committed: training is not deterministic, so the
check encodes with the committed files and never retrains.
"""

import argparse
import gzip
import warnings
import inspect
import io
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.jsonl.gz")


# ---------------------------------------------------------------- the corpus


def make_corpus():
    """A few thousand varied lines, the same every time for a given Python."""
    rng = random.Random(20240611)
    warnings.simplefilter("ignore")
    lines = []

    # English prose: paragraphs of the standard library's docstrings.
    import collections, functools, itertools, json as js, re, string, textwrap, argparse as ap, email, http.client, logging, pathlib, subprocess, threading, unittest, decimal, fractions, statistics, datetime, calendar, csv, sqlite3, zipfile, tarfile, shutil, tempfile, socket, ssl, asyncio, typing, dataclasses, enum, abc, heapq, bisect, contextlib, pprint, difflib, html, xml.dom.minidom, urllib.parse, base64, hashlib, hmac, secrets, uuid, locale, gettext, codecs, struct, array, io as iom, operator, copy, pickle, shelve, glob, fnmatch, optparse, getopt, traceback, inspect as ins, ast, dis, tokenize, pdb, timeit, cProfile, math, cmath, random as rnd
    mods = [collections, functools, itertools, js, re, string, textwrap, ap, email, http.client, logging, pathlib,
            subprocess, threading, unittest, decimal, fractions, statistics, datetime, calendar, csv, sqlite3,
            zipfile, tarfile, shutil, tempfile, socket, ssl, asyncio, typing, dataclasses, enum, abc, heapq, bisect,
            contextlib, pprint, difflib, html, xml.dom.minidom, urllib.parse, base64, hashlib, hmac, secrets, uuid,
            locale, gettext, codecs, struct, array, iom, operator, copy, pickle, shelve, glob, fnmatch, optparse,
            getopt, traceback, ins, ast, dis, tokenize, pdb, timeit, cProfile, math, cmath, rnd]
    prose = []
    for m in mods:
        docs = [m.__doc__ or ""]
        for name, obj in sorted(vars(m).items()):
            if name.startswith("_"):
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
                d = getattr(obj, "__doc__", None)
                if isinstance(d, str):
                    docs.append(d)
        for d in docs:
            for para in d.split("\n\n"):
                para = " ".join(para.split())
                if 20 <= len(para) <= 600:
                    prose.append(para)
    prose = sorted(set(prose))
    rng.shuffle(prose)
    lines += prose[:1800]

    words = sorted({w for p in prose for w in p.split() if w.isalpha()})

    accented = [
        "Café au lait, s'il vous plaît ! Où est la bibliothèque ?",
        "Über den Wolken muß die Freiheit wohl grenzenlos sein. Straße, Größe, Ärger.",
        "El niño comió piñas y jalapeños en la mañana del lunes; ¿qué más?",
        "Ça va? Très bien, merci. Noël à l'hôtel Crémieux.",
        "Tiếng Việt có nhiều dấu: ă â đ ê ô ơ ư, và thanh điệu.",
        "İstanbul'da ılık bir gün; IŞIK ve ığdır, İİİ.",
        "Ελληνικά: Καλημέρα κόσμε! ΣΊΣΥΦΟΣ ς σ Σ",
        "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Dansk: Æblegrød på øen Ærø; Åse.",
        "naïve coöperation résumé façade jalapeño piñata Zoë Brontë",
        "decomposed: e\u0301 a\u0300 n\u0303 o\u0308 combining\u0327 \u0301alone",
        "ﬁnance ﬂower Ⅻ ① ² ½ ™ ℃ Å",
        "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ　１２３",
    ]
    cjk = [
        "我爱北京天安门。今天天气很好！",
        "日本語のテキスト、ひらがなとカタカナ。東京タワー",
        "한국어 문장입니다. 안녕하세요!",
        "混合 mixed 文字 text 123 和 emoji 😀",
        "中文标点：“引号”、（括号）《书名》……",
        "𠀀𠀁𪜀 rare CJK extension B and C 𫝀",
        "漢字かな交じり文と半角ｶﾀｶﾅ",
    ]
    emoji = [
        "I love it 😍😍😍 so much!!!",
        "Family: 👨‍👩‍👧‍👦 and flags 🇺🇸🇫🇷🇯🇵 and skin tones 👍🏽👍🏿",
        "🤖🚀✨ launch day ✨🚀🤖",
        "keycap 1️⃣ #️⃣ and ❤️ vs ❤",
        "math ∀x∈ℝ: x²≥0 ∑∫√∞ ≠ ≈",
        "arrows → ← ↑ ↓ ⇒ and box ┌─┐ │ └─┘",
    ]
    special = [
        "[CLS] this line has [SEP] special tokens [MASK] inside [PAD] text [UNK]",
        "lowercase [mask] and [cls] are not special",
        "<|endoftext|>The end.<|endoftext|> And a new start",
        "mask me <mask> please, and <mask>twice<mask>",
        "say ferry and ferryboat and the ferry.",
        "hello world, hello  world, helloworld",
        "<s> and </s> and <pad> and <unk>",
    ]
    whitespace = [
        "",
        " ",
        "   ",
        "\t",
        "\n",
        "trailing spaces   ",
        "   leading spaces",
        "many     spaces     between     words",
        "tabs\tbetween\t\twords\t",
        "new\nlines\n\nand\r\nwindows\r\nline ends",
        "nbsp\u00a0between\u00a0words and ideographic\u3000space",
        "zero\u200bwidth\u200bspace and soft\u00adhyphen",
        "control\x00chars\x07here\x1bthere\ufffdreplacement",
        "  \t mixed \n\t whitespace \u2003 em space \u2009 thin ",
        "x" + " " * 40 + "y",
    ]
    numbers = [
        "3.14159265358979 and 2.71828 and 1,000,000.00",
        "Call 555-0123 or +1 (800) 555-0199 before 11:59pm on 2024-02-29.",
        "Version 1.2.3-rc.4+build.5 released 12/31/1999 at 23:59:59",
        "0x1F 0b1010 0o777 1e-10 6.022e23 -42 +17 100%",
        "IPv4 192.168.0.1 and IPv6 fe80::1ff:fe23:4567:890a",
        "1234567890123456789012345678901234567890",
        "٣٤٥ Arabic-Indic ۴۵۶ and Devanagari १२३ and fullwidth １２３",
    ]
    punct = [
        "Hello, world! How's it going? I'm fine; they're here: we've won.",
        "Don't, won't, can't, shouldn't've, y'all'd've, O'Neil's",
        "DON'T SHOUT, I'LL HEAR YOU'RE 'QUOTED' 'S 'T",
        "\"Quotes\" and 'single' and `backticks` and «guillemets» and „German“",
        "Ellipsis... em—dash en–dash hyphen-ated (parens) [brackets] {braces}",
        "Symbols: $100, €50, £30, ¥1000, ₹500, @user #hashtag & more ^_^ ~tilde~ |pipe|",
        "Code: if (x != y && z >= 0) { return a[i] + b->c; } // comment",
        "URL https://example.com/path?query=1&other=two#frag and mail foo.bar@example.org",
        "!!!???...,,,;;;:::---___***",
        "def f(x): return x**2 + 3*x - 1  # Python",
        "C:\\Windows\\System32\\drivers\\etc\\hosts",
    ]
    longw = [
        "Pneumonoultramicroscopicsilicovolcanoconiosis is long.",
        "a" * 99,
        "b" * 100,
        "c" * 101,
        "supercalifragilisticexpialidocious" * 4,
        "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
        "x" * 300 + " end",
        "é" * 120,
        "🙂" * 60,
        "日" * 150,
    ]
    fixed = accented + cjk + emoji + special + whitespace + numbers + punct + longw
    lines += fixed

    # Mixed lines: prose words with the odd pieces spliced in.
    pieces = [s for s in fixed if s.strip()]
    for _ in range(700):
        n = rng.randint(3, 25)
        ws = [rng.choice(words) for _ in range(n)]
        for _ in range(rng.randint(0, 3)):
            piece = rng.choice(pieces)
            a = rng.randint(0, max(0, len(piece) - 1))
            b = min(len(piece), a + rng.randint(1, 20))
            ws.insert(rng.randint(0, len(ws)), piece[a:b])
        sep = rng.choice([" ", " ", " ", "  ", "\t", ", ", " - "])
        line = sep.join(ws)
        if rng.random() < 0.3:
            line = line.upper() if rng.random() < 0.5 else line.capitalize()
        lines.append(line)

    # Character soup from many scripts and categories.
    pool = ("abcXYZ019 \t.,;:!?'\"-_()[]{}<>/\\@#$%^&*+=~`|"
            "éÉàçñüßøåæœİıŞğ" "αβγΣςπ" "жЖщЫ" "אבג" "ابت" "ก ข ค" "你好世界" "あア" "한글"
            "😀🎉👍🏽‍♀️" "\u00a0\u3000\u2003\u200b\u00ad\u0301\u0308" "①²½™" "٣१" "\u2028\u2029")
    for _ in range(400):
        n = rng.randint(1, 60)
        lines.append("".join(rng.choice(pool) for _ in range(n)))

    return lines


def read_corpus():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def gz_jsonl(records):
    """Gzip'd JSON lines, byte for byte the same for the same records."""
    text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as g:
        g.write(text.encode("utf-8"))
    return buf.getvalue()


def gz_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as g:
        g.write(data)
    return buf.getvalue()


# ---------------------------------------------------------------- tokenizers


def gpt2_from(assets):
    """GPT-2's tokenizer.json, as Hugging Face's gpt2 repository has it, from vocab.json and merges.txt."""
    bpe = models.BPE.from_file(os.path.join(assets, "vocab.json"), os.path.join(assets, "merges.txt"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", normalized=True, special=True)])
    return tok


def train_wordpiece(corpus, lowercase):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    if lowercase:
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                                    strip_accents=True, lowercase=True)
    else:
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=False, lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=3000 if lowercase else 4000, min_frequency=2,
                                        special_tokens=specials, continuing_subword_prefix="##",
                                        show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if lowercase:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        tok.enable_truncation(max_length=24)
        tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]", pad_to_multiple_of=8)
    else:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def train_bbpe(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)])
    tok.add_tokens([AddedToken("ferry", single_word=True, normalized=True),
                    AddedToken("hello world", rstrip=True, normalized=False)])
    return tok


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_sentencepiece_bpe(corpus):
    """A Llama-2-like BPE: "▁" for spaces, <0xNN> byte fallback, fused unknowns."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, limit_alphabet=150, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    return vocab, merges


def llama2_like(vocab, merges):
    """Llama 2's layout: Prepend and Replace normalizers, no pre-tokenizer."""
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    return tok


def metaspace_like(vocab, merges):
    """The newer layout of the same model: a Metaspace pre-tokenizer and decoder."""
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    return tok


def train_llama3_like(corpus):
    """A Llama-3-like byte-level BPE: its split regex, ignore_merges, <|begin_of_text|>."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bot)])])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_ws_nfkc(corpus):
    """NFKC and Lowercase, the Whitespace pre-tokenizer, BPE with ## and </w>, the BPE decoder."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, limit_alphabet=200, special_tokens=["[UNK]"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    return tok


def train_ws_nfd(corpus):
    """Strip, NFD, StripAccents and Replace normalizers, WhitespaceSplit, WordPiece."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=30))
    tok.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.NFD(), normalizers.StripAccents(),
                                           normalizers.Replace("``", '"')])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordPieceTrainer(vocab_size=2500, min_frequency=2, special_tokens=["[UNK]"],
                                        show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


# ---------------------------------------------------------------- goldens


def encoding_record(i, j, enc, dec):
    r = {"i": i}
    if j is not None:
        r["j"] = j
    r["ids"] = enc.ids
    r["type_ids"] = enc.type_ids
    r["attention_mask"] = enc.attention_mask
    r["special_tokens_mask"] = enc.special_tokens_mask
    r["offsets"] = [list(o) for o in enc.offsets]
    r["decoded"] = dec
    return r


def goldens(tok, corpus, pairs):
    recs = []
    for i, line in enumerate(corpus):
        enc = tok.encode(line)
        recs.append(encoding_record(i, None, enc, tok.decode(enc.ids)))
    if pairs:
        for i in range(0, len(corpus) - 1, 10):
            enc = tok.encode(corpus[i], corpus[i + 1])
            recs.append(encoding_record(i, i + 1, enc, tok.decode(enc.ids)))
    return recs


def option_goldens(tok, corpus):
    """Truncation and padding options set by the caller, on singles, pairs and batches."""
    rng = random.Random(7)
    lines = [i for i, l in enumerate(corpus) if l.strip()]
    pairs = [(rng.choice(lines), rng.choice(lines)) for _ in range(40)]
    singles = [rng.choice(lines) for _ in range(24)]
    truncs = [None] + [dict(max_length=m, strategy=s, direction=d)
                       for m in (5, 12, 40) for s in ("longest_first", "only_first", "only_second")
                       for d in ("right", "left")]
    pads = [None, dict(direction="left", pad_id=0, pad_type_id=1, pad_token="[PAD]", length=48),
            dict(direction="right", pad_id=0, pad_type_id=0, pad_token="[PAD]", length=None, pad_to_multiple_of=16)]
    recs = []
    for trunc in truncs:
        for pad in pads:
            tok.no_truncation()
            tok.no_padding()
            if trunc:
                tok.enable_truncation(**trunc)
            if pad:
                tok.enable_padding(**pad)
            opts = {"truncation": trunc, "padding": pad}
            for i, j in pairs:
                r = {"opts": opts, "i": i, "j": j}
                try:
                    enc = tok.encode(corpus[i], corpus[j])
                except Exception as e:
                    r["error"] = str(e)
                    recs.append(r)
                    continue
                r.update({"ids": enc.ids, "type_ids": enc.type_ids, "attention_mask": enc.attention_mask,
                          "special_tokens_mask": enc.special_tokens_mask})
                recs.append(r)
            for k in range(0, len(singles), 4):
                batch = singles[k:k + 4]
                try:
                    encs = tok.encode_batch([corpus[i] for i in batch])
                except Exception as e:
                    recs.append({"opts": opts, "batch": batch, "error": str(e)})
                    continue
                recs.append({"opts": opts, "batch": batch, "batch_ids": [e.ids for e in encs],
                             "batch_attention_mask": [e.attention_mask for e in encs],
                             "batch_type_ids": [e.type_ids for e in encs]})
    tok.no_truncation()
    tok.no_padding()
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate in memory and fail on any difference")
    ap.add_argument("--corpus", action="store_true", help="rebuild the corpus first")
    ap.add_argument("--train", action="store_true", help="retrain the trained tokenizers (their ids change)")
    ap.add_argument("--gpt2-from", metavar="DIR", help="rebuild gpt2.json.gz from GPT-2's vocab.json and merges.txt in DIR")
    args = ap.parse_args()

    files = {}  # path -> bytes
    if args.corpus:
        files[CORPUS] = gz_jsonl(make_corpus())
        with open(CORPUS, "wb") as f:
            f.write(files[CORPUS])
    corpus = read_corpus()

    gpt2_path = os.path.join(HERE, "gpt2.json.gz")
    if args.gpt2_from:
        with open(gpt2_path, "wb") as f:
            f.write(gz_bytes(gpt2_from(args.gpt2_from).to_str().encode("utf-8")))

    toks = {}
    with open(os.path.join(HERE, "minilm.json"), encoding="utf-8") as f:
        toks["minilm"] = Tokenizer.from_str(f.read())
    with gzip.open(gpt2_path, "rt", encoding="utf-8") as f:
        toks["gpt2"] = Tokenizer.from_str(f.read())
    sp = {}

    def sentencepiece():
        if not sp:
            sp["vm"] = train_sentencepiece_bpe(corpus)
        return sp["vm"]

    trained = [("wp-cased", lambda: train_wordpiece(corpus, False)),
               ("wp-uncased", lambda: train_wordpiece(corpus, True)),
               ("bbpe", lambda: train_bbpe(corpus)),
               ("llama2", lambda: llama2_like(*sentencepiece())),
               ("metaspace", lambda: metaspace_like(*sentencepiece())),
               ("llama3", lambda: train_llama3_like(corpus)),
               ("ws-nfkc", lambda: train_ws_nfkc(corpus)),
               ("ws-nfd", lambda: train_ws_nfd(corpus))]
    for name, train in trained:
        path = os.path.join(HERE, name + ".json")
        if args.train or not os.path.exists(path):
            # Training is not deterministic (WordPiece's alphabet order follows a
            # hash map): trained tokenizers are committed, and only --train
            # replaces them.
            tok = train()
            with open(path, "w", encoding="utf-8") as f:
                f.write(tok.to_str(pretty=True) + "\n")
        with open(path, encoding="utf-8") as f:
            toks[name] = Tokenizer.from_str(f.read())

    for name, tok in toks.items():
        pairs = name.startswith("wp") or name in ("minilm", "llama2", "llama3")
        files[os.path.join(HERE, "golden-" + name + ".jsonl.gz")] = gz_jsonl(goldens(tok, corpus, pairs))

    files[os.path.join(HERE, "golden-options.jsonl.gz")] = gz_jsonl(option_goldens(toks["wp-cased"], corpus))

    if args.check:
        bad = 0
        for path, data in sorted(files.items()):
            try:
                with open(path, "rb") as f:
                    old = f.read()
            except FileNotFoundError:
                print(f"{os.path.relpath(path)}: missing; run tokenizer/testdata/gen.py", file=sys.stderr)
                bad += 1
                continue
            if path.endswith(".gz"):
                old, data = gzip.decompress(old), gzip.decompress(data)
            if old != data:
                ol, nl = old.split(b"\n"), data.split(b"\n")
                k = next((k for k in range(min(len(ol), len(nl))) if ol[k] != nl[k]), min(len(ol), len(nl)))
                print(f"{os.path.relpath(path)}: differs from what tokenizers {tokenizers.__version__} gives, "
                      f"first at line {k + 1}:\n  committed: {ol[k][:300] if k < len(ol) else b'(end)'}\n"
                      f"  now:       {nl[k][:300] if k < len(nl) else b'(end)'}", file=sys.stderr)
                bad += 1
        if bad:
            print(f"{bad} tokenizer golden file(s) differ; regenerate with python tokenizer/testdata/gen.py "
                  f"and review the change", file=sys.stderr)
            sys.exit(1)
        print(f"tokenizer goldens: {len(files)} files match tokenizers {tokenizers.__version__} "
              f"({len(corpus)} corpus lines, {len(toks)} tokenizers)")
        return
    for path, data in files.items():
        with open(path, "wb") as f:
            f.write(data)
    print(f"wrote {len(files)} files for {len(corpus)} corpus lines and {len(toks)} tokenizers "
          f"(tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
