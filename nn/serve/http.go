package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// HandlerConfig limits what one request may ask. Zero fields take the
// defaults.
type HandlerConfig struct {
	// MaxTexts is the most texts in one request. Default 64.
	MaxTexts int
	// MaxBodyBytes is the largest request body. Default 1 MiB.
	MaxBodyBytes int64
}

// EmbedRequest is the JSON body of a request.
type EmbedRequest struct {
	Texts []string `json:"texts"`
}

// EmbedResponse is the JSON body of a successful answer: one embedding per
// text, in the request's order, each of Dim values, and each text's number
// of tokens.
type EmbedResponse struct {
	Embeddings [][]float32 `json:"embeddings"`
	Dim        int         `json:"dim"`
	Tokens     []int       `json:"tokens"`
}

// ErrorResponse is the JSON body of an error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// handler is NewHandler's http.Handler.
type handler struct {
	b        *Batcher
	tokenize func(string) (Row, error)
	cfg      HandlerConfig
}

// NewHandler returns the HTTP handler of the embedding endpoint: a POST
// whose JSON body is {"texts": [...]} is answered with an EmbedResponse.
// Status codes: 400 for bad input, naming the problem (not JSON, no texts,
// too many, a text that does not tokenize or is longer than b.MaxLen
// tokens, naming which); 405 for another method; 413 for a body over
// MaxBodyBytes; 503 when the queue is full (with Retry-After) or b is
// closed; 500 when the model fails. Every error body is an ErrorResponse.
func NewHandler(b *Batcher, tokenize func(text string) (Row, error), cfg HandlerConfig) http.Handler {
	if cfg.MaxTexts <= 0 {
		cfg.MaxTexts = 64
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	return &handler{b: b, tokenize: tokenize, cfg: cfg}
}

// postOnly answers a request whose method is not POST with 405, naming the
// endpoint, and reports whether the request is a POST.
func postOnly(w http.ResponseWriter, r *http.Request, endpoint string) bool {
	if r.Method == http.MethodPost {
		return true
	}
	w.Header().Set("Allow", http.MethodPost)
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s: the %s endpoint takes POST", r.Method, endpoint))
	return false
}

// ServeHTTP answers one request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !postOnly(w, r, "embedding") {
		return
	}
	texts, status, msg := h.parse(w, r)
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	rows := make([]Row, len(texts))
	tokens := make([]int, len(texts))
	for i, t := range texts {
		row, err := h.tokenize(t)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("texts[%d] does not tokenize: %v", i, err))
			return
		}
		if len(row.IDs) == 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("texts[%d] has no tokens", i))
			return
		}
		if len(row.IDs) > h.b.MaxLen() {
			writeError(w, http.StatusBadRequest, (&TooLongError{Index: i, Tokens: len(row.IDs), Max: h.b.MaxLen()}).Error())
			return
		}
		rows[i], tokens[i] = row, len(row.IDs)
	}
	emb, err := h.b.Embed(r.Context(), rows)
	if err != nil {
		h.fail(w, err)
		return
	}
	resp := EmbedResponse{Embeddings: emb, Tokens: tokens}
	if len(emb) > 0 {
		resp.Dim = len(emb[0])
	}
	writeJSON(w, http.StatusOK, resp)
}

// parse reads the body's texts, or says which status and message answer it.
func (h *handler) parse(w http.ResponseWriter, r *http.Request) ([]string, int, string) {
	var req EmbedRequest
	if status, msg := decodeBody(w, r, h.cfg.MaxBodyBytes, &req, `{"texts": ["...", ...]}`); status != 0 {
		return nil, status, msg
	}
	switch {
	case len(req.Texts) == 0:
		return nil, http.StatusBadRequest, `"texts" is empty or missing: give at least one text`
	case len(req.Texts) > h.cfg.MaxTexts:
		return nil, http.StatusBadRequest, fmt.Sprintf(`"texts" has %d texts, more than the %d a request may have`, len(req.Texts), h.cfg.MaxTexts)
	}
	return req.Texts, 0, ""
}

// decodeBody reads r's body, at most maxBytes, as the JSON object v, of
// the form form, and nothing after it; or says which status and message
// answer the request.
func decodeBody(w http.ResponseWriter, r *http.Request, maxBytes int64, v any, form string) (int, string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", tooBig.Limit)
		}
		return http.StatusBadRequest, "reading the body: " + err.Error()
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, "the body is not JSON of the form " + form + ": " + err.Error()
	}
	if dec.More() {
		return http.StatusBadRequest, "the body has more after its JSON object " + form
	}
	return 0, ""
}

// fail answers an error of Embed.
func (h *handler) fail(w http.ResponseWriter, err error) {
	var tooLong *TooLongError
	switch {
	case errors.Is(err, ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the queue is full (%d requests wait for the model); retry later", h.b.QueueSize()))
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
	case errors.As(err, &tooLong):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "the request ended before its texts ran: "+err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "the model failed: "+err.Error())
	}
}

// writeError writes an ErrorResponse.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorResponse{Error: msg})
}

// writeJSON writes v as the JSON body of a status answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
