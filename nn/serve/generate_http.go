package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/ferryml/ferry/nn"
)

// GenerateRequest is the JSON body of a generation request: the prompt as
// text (Prompt, which needs a Codec) or as token ids (IDs), one of them.
type GenerateRequest struct {
	Prompt      *string  `json:"prompt,omitempty"`
	IDs         []int32  `json:"ids,omitempty"`
	MaxTokens   int      `json:"max_tokens"`            // the most new tokens; 0: the handler's default
	Temperature *float64 `json:"temperature,omitempty"` // 0 or absent: greedy
	TopK        int      `json:"top_k,omitempty"`       // sample among the top_k most likely; 0: all
	Stop        []int32  `json:"stop,omitempty"`        // token ids that end the generation
}

// GenerateResponse is the JSON body of a successful generation: the new
// tokens, their text (with a Codec), the prompt's number of tokens, and why
// it ended ("stop" or "length").
type GenerateResponse struct {
	Tokens       []int32 `json:"tokens"`
	Text         string  `json:"text,omitempty"`
	PromptTokens int     `json:"prompt_tokens"`
	FinishReason string  `json:"finish_reason"`
}

// Codec turns text into token ids and back (a tokenizer); either function
// may be nil.
type Codec struct {
	Encode func(text string) ([]int32, error)
	Decode func(ids []int32) (string, error)
}

// GenHandlerConfig sets the generation endpoint's defaults and limits.
// Zero fields take the defaults.
type GenHandlerConfig struct {
	// DefaultMaxTokens is max_tokens when a request leaves it out. Default
	// 16, at most the batcher's MaxTokens.
	DefaultMaxTokens int
	// MaxBodyBytes is the largest request body. Default 1 MiB.
	MaxBodyBytes int64
}

// genHandler is NewGenerateHandler's http.Handler.
type genHandler struct {
	b     *GenBatcher
	codec Codec
	cfg   GenHandlerConfig
}

// NewGenerateHandler returns the HTTP handler of the generation endpoint:
// a POST whose JSON body is a GenerateRequest is answered with a
// GenerateResponse once its tokens are generated, batched with concurrent
// requests by b. Status codes: 400 for bad input, naming the field and the
// problem (not JSON, no prompt or both forms, a prompt that does not
// tokenize, too long for the model with its max_tokens, tokens outside the
// vocabulary, max_tokens, temperature or top_k out of range); 405 for
// another method; 413 for a body over MaxBodyBytes; 503 when the queue is
// full (with Retry-After) or b is closed; 500 when the model fails. Every
// error body is an ErrorResponse.
func NewGenerateHandler(b *GenBatcher, codec Codec, cfg GenHandlerConfig) http.Handler {
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 16
	}
	cfg.DefaultMaxTokens = min(cfg.DefaultMaxTokens, b.cfg.MaxTokens)
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	return &genHandler{b: b, codec: codec, cfg: cfg}
}

// ServeHTTP answers one request.
func (h *genHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !postOnly(w, r, "generation") {
		return
	}
	req, status, msg := h.parse(w, r)
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	res, err := h.b.Generate(r.Context(), req)
	if err != nil {
		h.fail(w, err)
		return
	}
	resp := GenerateResponse{Tokens: res.Tokens, PromptTokens: len(req.Prompt), FinishReason: res.FinishReason}
	if resp.Tokens == nil {
		resp.Tokens = []int32{}
	}
	if h.codec.Decode != nil {
		if resp.Text, err = h.codec.Decode(res.Tokens); err != nil {
			writeError(w, http.StatusInternalServerError, "decoding the tokens: "+err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// parse reads the body into a GenRequest, or says which status and message
// answer it.
func (h *genHandler) parse(w http.ResponseWriter, r *http.Request) (GenRequest, int, string) {
	const form = `{"prompt": "..." or "ids": [...], "max_tokens": n, "temperature": t, "top_k": k, "stop": [...]}`
	var in GenerateRequest
	if status, msg := decodeBody(w, r, h.cfg.MaxBodyBytes, &in, form); status != 0 {
		return GenRequest{}, status, msg
	}
	req := GenRequest{Prompt: in.IDs, MaxTokens: in.MaxTokens, Stop: in.Stop, Sampling: nn.Sampling{TopK: in.TopK}}
	if in.Temperature != nil {
		req.Temperature = *in.Temperature
	}
	if req.MaxTokens == 0 {
		req.MaxTokens = h.cfg.DefaultMaxTokens
	}
	switch {
	case in.Prompt != nil && in.IDs != nil:
		return req, http.StatusBadRequest, `give "prompt" (text) or "ids" (token ids), not both`
	case in.Prompt == nil && in.IDs == nil:
		return req, http.StatusBadRequest, `"prompt" and "ids" are missing: give the prompt as text or as token ids`
	case in.Prompt != nil && h.codec.Encode == nil:
		return req, http.StatusBadRequest, `this model has no tokenizer: give the prompt as token ids, "ids": [...]`
	case in.Prompt != nil:
		var err error
		if req.Prompt, err = h.codec.Encode(*in.Prompt); err != nil {
			return req, http.StatusBadRequest, `"prompt" does not tokenize: ` + err.Error()
		}
	}
	if err := h.b.Check(req); err != nil {
		return req, http.StatusBadRequest, fmt.Sprintf("%q: %v", (err.(*GenRequestError)).Field, err)
	}
	return req, 0, ""
}

// fail answers an error of Generate.
func (h *genHandler) fail(w http.ResponseWriter, err error) {
	var bad *GenRequestError
	switch {
	case errors.Is(err, ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the queue is full (%d requests wait for the model); retry later", h.b.cfg.QueueSize))
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q: %v", bad.Field, err))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "the request ended before its tokens were generated: "+err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "the model failed: "+err.Error())
	}
}
