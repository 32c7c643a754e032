// Package serve serves an embedding model over HTTP, batching concurrent
// requests into one call of the model.
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
package serve
