"""The request-row schema: the fields of one request row, `Workload.requests[..., field]`
(int32). Every floor reads rows; the schema lives here, at the bottom, so policies and
servers import no input module."""

ARRIVAL, ORDER, PROMPT, OUTPUT, CACHED = range(5)  # arrival step, number in trace order, tokens
NUM_FIELDS = 5
