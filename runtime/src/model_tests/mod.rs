//! The runtime's tests on the small synthetic pack [`crate::testing`] writes, one file per part of
//! the model they check. They sit above the modules they test, so none of them imports them.

mod delta_net;
mod evaluate;
mod forward;
mod head;
mod load;
mod npu;
mod session;
mod short_conv;
mod stats;
