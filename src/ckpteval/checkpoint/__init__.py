"""A checkpoint, read before submission: its layout on disk, its training args and architecture, the forward
args that change what it computes, its tokenizer source, where it came from and its identity.

Torch-free: small torch files are read by `checkpoint.torchfiles` without torch, so describing a checkpoint is
quick anywhere. Loading one to serve is the server's (`ckpteval.server.checkpoint`).
"""
