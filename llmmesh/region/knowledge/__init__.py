"""What a region knows beyond a conversation: files and vector stores in the
zone's retrieval store, retrieval into a turn's context, and the memory of
end users' facts."""
