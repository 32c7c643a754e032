// Package serve serves an embedding model, or a language model's
// generation, over HTTP, batching concurrent requests into one call of the
// model.
//
// A Batcher collects the texts of concurrent requests into batches and runs
// each batch as one call of a Model. Batches are padded to a few bucketed
// shapes, the batch size and the sequence length each rounded up to the
// next of Config.BatchSizes and Config.SeqLens, so a jitted model compiles
// once per bucket and never again, whatever the traffic. Padding tokens are
// masked out (Batch.Mask). A batch runs when it is full or when its oldest
// text has waited Config.MaxWait (2 ms by default). The queue is bounded: a
// request that finds it full gets ErrQueueFull at once, never a wait.
// Close stops taking requests and runs everything queued before it returns.
//
// NewHandler puts a Batcher behind HTTP: POST a JSON body {"texts": [...]}
// and get {"embeddings": [[...]], "dim": D, "tokens": [...]} back, one
// embedding per text in the order given. Bad input is a 400 that names the
// problem (a body that is not JSON, an empty list, too many texts, a text
// too long for the model, naming which); a full queue or a server shutting
// down is a 503.
//
// The batching core knows nothing of the model: a Model is any function of
// a padded Batch. NewBertEmbedder makes one of an nn.Bert (mean pooling
// over the real tokens, then L2 normalisation, as sentence-transformers'
// all-MiniLM-L6-v2 does), jitted, counting its compiles; Tokenize adapts a
// tokenizer.Tokenizer. examples/serve serves all-MiniLM-L6-v2 this way and
// load-tests it.
//
//	emb := serve.NewBertEmbedder(model)
//	b, _ := serve.NewBatcher(emb.Run, serve.Config{})
//	tok, _ := serve.Tokenize(t)
//	http.Handle("POST /embed", serve.NewHandler(b, tok, serve.HandlerConfig{}))
//	...
//	srv.Shutdown(ctx) // in-flight requests finish
//	b.Close(ctx)      // queued batches run
//
// Generation: a GenBatcher collects concurrent generation requests into
// one batched nn.Generator.Generate: requests that arrive within
// GenConfig.MaxWait of the oldest and sample alike join one batch of
// prompts of different lengths (padded on the right, one position per
// row), padded to one of GenConfig.BatchSizes with one-token filler rows,
// so the decode step compiles once per batch size. Each row stops at its
// own stop tokens and max_tokens; the batch ends when its last row does,
// so a batch is bounded by GenConfig.MaxTokens decode steps. A greedy
// request gets exactly the tokens its prompt gives alone.
// NewGenerateHandler is its endpoint: POST {"prompt": "..." or "ids":
// [...], "max_tokens": n, "temperature": t, "top_k": k, "stop": [...]}
// answers {"tokens": [...], "text": "...", "prompt_tokens": n,
// "finish_reason": "stop" or "length"}, with the same 400s, 503s and
// shutdown as the embedding endpoint.
//
//	g := nn.NewGenerator(model, 256, 0)
//	gb, _ := serve.NewGeneratorBatcher(g, serve.GenConfig{Vocab: vocab})
//	http.Handle("POST /generate", serve.NewGenerateHandler(gb, serve.Codec{Encode: enc, Decode: dec}, serve.GenHandlerConfig{}))
package serve
