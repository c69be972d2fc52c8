//! Wire types for gpu-attest, generated from the `.proto` files beside this one.
