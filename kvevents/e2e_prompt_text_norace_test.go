//go:build !race

package kvevents

// promptTextE2EModels are the models of TestE2EPromptTextMatchesEngineTokens:
// one under the race detector (a model load is slow there), both without.
var promptTextE2EModels = []string{"llama3", "qwen3"}
