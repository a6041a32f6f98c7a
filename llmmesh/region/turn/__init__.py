"""One chat turn, in the stages :class:`region.gateway.ChatGateway` runs
in order: prepare (:mod:`.prepare`, with the prompt of :mod:`.prompt`),
admit (:mod:`.admit`), place (:mod:`.place`), stream (:mod:`.stream`) and
record (:mod:`.record`); and what they share: the turn at the door and
ready (:mod:`.request`), its state as it runs (:mod:`.state`), validation,
the conversation context, prompt rendering, tool calls and the streaming
output filter."""
