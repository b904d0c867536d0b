"""The byte-level tokenizer of the example model as a Hugging Face fast tokenizer.

Ids 0-255 are the bytes, 256 is <bos> and 257 is <eos>: vocabulary 258. The `tokenizers`
pipeline is a ByteLevel pre-tokenizer (each byte of the UTF-8 text becomes one printable
stand-in character, no splitting, no prefix space) and a BPE model without merges whose
vocabulary maps the stand-in of byte b to id b, so every text encodes to exactly its UTF-8
bytes. The post-processor puts <bos> before each sequence; the ByteLevel decoder turns ids back
into bytes and decodes them as UTF-8 with replacement. <eos> doubles as the padding token,
padding goes on the left (the decoder is causal), and "<bos>" or "<eos>" written in a text
stays text (split_special_tokens): only the ids 256 and 257 are special.
"""

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258
BOS = "<bos>"
EOS = "<eos>"


def build_backend():
    """The `tokenizers` Tokenizer: bytes as ids 0-255, <bos> prepended."""
    stand_in = _bytes_to_unicode()
    assert set(stand_in.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    vocab = {stand_in[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BOS, special=True, normalized=False),
                            AddedToken(EOS, special=True, normalized=False)])
    assert tok.token_to_id(BOS) == BOS_ID and tok.token_to_id(EOS) == EOS_ID
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)])
    return tok


def _bytes_to_unicode():
    """GPT-2's map from each byte to the printable character ByteLevel writes for it."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build(model_max_length=1024):
    """The PreTrainedTokenizerFast that save_pretrained writes beside the weights."""
    return PreTrainedTokenizerFast(
        tokenizer_object=build_backend(), bos_token=BOS, eos_token=EOS, pad_token=EOS,
        padding_side="left", model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"], clean_up_tokenization_spaces=False,
        split_special_tokens=True)


def check(tok):
    """Asserts the contract above on tok, e.g. AutoTokenizer.from_pretrained of a checkpoint."""
    # Every ASCII character, 2-, 3- and 4-byte UTF-8 and the special tokens' names as text.
    for text in ("héllo\n\x00", "".join(map(chr, range(128))) + " é ∑ 𝄞 <bos><eos>  \r\n"):
        ids = tok.encode(text)
        assert ids == [BOS_ID] + list(text.encode("utf-8")), ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode([0xC3, ord("A"), 0xFF]) == "\ufffdA\ufffd"
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, EOS_ID)
    batch = tok(["ab", "héllo"], padding=True)
    assert batch["input_ids"] == [[EOS_ID] * 4 + [BOS_ID, 97, 98],
                                  [BOS_ID] + list("héllo".encode("utf-8"))]
    assert batch["attention_mask"] == [[0] * 4 + [1] * 3, [1] * 7]
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == ["ab", "héllo"]


if __name__ == "__main__":
    # python hf_tokenizer.py DIR: writes the tokenizer to DIR unless DIR holds one, then checks
    # the one AutoTokenizer loads from DIR.
    import os
    import sys

    if not os.path.exists(os.path.join(sys.argv[1], "tokenizer.json")):
        build().save_pretrained(sys.argv[1])
    check(AutoTokenizer.from_pretrained(sys.argv[1]))
    print(f"{sys.argv[1]}: byte-level tokenizer, {VOCAB_SIZE} ids, checks passed")
