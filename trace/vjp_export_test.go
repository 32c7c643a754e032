package trace

// HasVJPRule exposes hasVJP to the external tests (coverage of the rules table).
var HasVJPRule = hasVJP
