// Package tokenizer loads a Hugging Face tokenizer.json (the serialization
// of the Python and Rust `tokenizers` library) and encodes text to token
// ids, and decodes ids to text, exactly as that library does: the ids,
// type ids, attention mask, special-tokens mask and offsets of every line of
// a few-thousand-line corpus (prose, code, numbers, accents, CJK, emoji,
// control characters, whitespace runs, very long words) are compared in
// the tests with what tokenizers 0.23.3 gives, for the real
// sentence-transformers all-MiniLM-L6-v2 and GPT-2 tokenizers and for eight
// tokenizers trained for the test (WordPiece cased and uncased, byte-level
// BPE, Llama-2-style and Llama-3-style BPE, a Metaspace BPE, NFKC and NFD
// pipelines).
//
// The pipeline is Hugging Face's: added tokens ([CLS], <|endoftext|>, ...)
// are found first, per their single_word, lstrip, rstrip and normalized
// flags; the rest of the text goes through the normalizer, the
// pre-tokenizer and the model; then truncation, the post-processor's
// special tokens and padding. Supported components:
//
//   - models: WordPiece (BERT), BPE (merges by rank with a cache; byte
//     fallback, fused unknowns, continuing-subword prefix, end-of-word
//     suffix, ignore_merges);
//   - normalizers: BertNormalizer, Lowercase, NFD, NFKD, NFC, NFKC,
//     StripAccents, Prepend, Replace (string pattern), Strip, Sequence;
//   - pre-tokenizers: BertPreTokenizer, ByteLevel (GPT-2's split regex),
//     Metaspace, Split with GPT-2's or Llama 3's regex, Whitespace,
//     WhitespaceSplit, Sequence;
//   - post-processors: TemplateProcessing, BertProcessing, ByteLevel,
//     Sequence;
//   - decoders: WordPiece, BPEDecoder, ByteLevel, Metaspace, Replace
//     (string pattern), ByteFallback, Fuse, Strip, Sequence;
//   - truncation (LongestFirst, OnlyFirst, OnlySecond; right or left) and
//     padding (fixed length or the batch's longest, a multiple, right or
//     left) from the file, or set with WithTruncation and WithPadding.
//
// Anything else (the Unigram and WordLevel models, RobertaProcessing,
// Split with another regex, BPE dropout, ...) is refused by Load with an
// error that names the component: the package never encodes with a part of
// the pipeline left out.
//
// Offsets are byte offsets into the text passed to Encode (Python's
// tokenizers reports them in characters). Invalid UTF-8 in the text is read
// as U+FFFD, one per invalid byte. Decode returns an error for an id
// outside the vocabulary where Hugging Face skips it. Hugging Face's
// overflowing tokens (truncation's stride) are not kept.
package tokenizer
