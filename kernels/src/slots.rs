//! One slot per device, and what happens to a device after a fault.
//!
//! CUDA faults are sticky: after an illegal address or a lost device every later call on the
//! context fails. The slot then drops its runtime (the context with it) and tries to open a
//! fresh one, so that where the driver allows it the fault ends one challenge only. The driver
//! documentation does not promise that this works in-process, and on an H100 (driver 580) it
//! did not: after an illegal-address fault every new context of the process on that device
//! failed with the same error, a reset primary context and a non-primary one alike. The device
//! is then out of service: the failing challenge's error says so, with the reason; the slot
//! refuses all later work on it at once (no challenge is started and failed on it), and
//! [`DeviceSlots::out_of_service`] lets the miner stop for its supervisor to restart it, which
//! gives the device back.
//!
//! Generic over the runtime so that this state machine is tested without a GPU.

use gpu_attest_shared::backend::BackendError;
use std::ops::Deref;
use std::sync::{Mutex, MutexGuard};

/// What a slot needs to know of the runtime it holds.
pub(crate) trait Runtime {
    /// The context is unusable (a sticky fault): the runtime must be replaced.
    fn faulted(&self) -> bool;
}

enum Slot<R> {
    Open(R),
    /// Could not be reopened after a fault; the reason. Stays so until the process restarts.
    OutOfService(String),
}

pub(crate) struct DeviceSlots<R> {
    slots: Vec<Mutex<Slot<R>>>,
}

/// A locked device whose runtime is open.
pub(crate) struct SlotGuard<'a, R>(MutexGuard<'a, Slot<R>>);

impl<R> Deref for SlotGuard<'_, R> {
    type Target = R;

    fn deref(&self) -> &R {
        match &*self.0 {
            Slot::Open(runtime) => runtime,
            Slot::OutOfService(_) => unreachable!("a SlotGuard is only made for an open slot"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a device leaves nothing half-written that a later run relies on:
    // every run allocates and fills its own buffers.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<R: Runtime> DeviceSlots<R> {
    pub(crate) fn new(runtimes: Vec<R>) -> Self {
        DeviceSlots {
            slots: runtimes.into_iter().map(|r| Mutex::new(Slot::Open(r))).collect(),
        }
    }

    /// Device `device`, locked; an error at once if it is out of service.
    pub(crate) fn get(&self, device: u32) -> Result<SlotGuard<'_, R>, BackendError> {
        let slot = self.slots.get(device as usize).ok_or(BackendError::NoSuchDevice {
            device,
            count: self.slots.len() as u32,
        })?;
        let guard = lock(slot);
        if let Slot::OutOfService(reason) = &*guard {
            return Err(BackendError::OutOfService {
                device,
                detail: reason.clone(),
            });
        }
        Ok(SlotGuard(guard))
    }

    /// Runs `work` on device `device`. A device error that left the context unusable replaces
    /// the runtime with `reopen(device)`; if that fails too, the device goes out of service.
    /// Either way the error says which happened.
    pub(crate) fn with<T>(
        &self,
        device: u32,
        reopen: impl FnOnce(u32) -> Result<R, String>,
        work: impl FnOnce(&R) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut guard = self.get(device)?;
        let result = work(&guard);
        match result {
            Err(BackendError::Device { detail, .. }) if guard.faulted() => {
                // The old runtime (and its context) must be gone before a fresh one is opened.
                drop(std::mem::replace(&mut *guard.0, Slot::OutOfService(detail.clone())));
                let outcome = match reopen(device) {
                    Ok(runtime) => {
                        *guard.0 = Slot::Open(runtime);
                        "the device was reset and is ready for the next challenge".to_string()
                    }
                    Err(e) => {
                        let reason = format!(
                            "it faulted ({detail}) and could not be reset ({e}); check the GPU (nvidia-smi) and restart the miner"
                        );
                        *guard.0 = Slot::OutOfService(reason);
                        format!("the device could not be reset ({e}); it takes no more work until the miner restarts")
                    }
                };
                Err(BackendError::Device {
                    device,
                    detail: format!("{detail}; {outcome}"),
                })
            }
            other => other,
        }
    }

    /// The devices out of service, with the reason of each, in device order. Never waits: a
    /// slot that is locked is running work (its runtime is open) or being reset, and is counted
    /// as in service this time. A daemon asks this every few seconds from an async task, and
    /// `with` holds a slot's lock for a whole challenge.
    pub(crate) fn out_of_service(&self) -> Vec<(u32, String)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| {
                let guard = match slot.try_lock() {
                    Ok(guard) => guard,
                    Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => return None,
                };
                match &*guard {
                    Slot::OutOfService(reason) => Some((i as u32, reason.clone())),
                    Slot::Open(_) => None,
                }
            })
            .collect()
    }

    /// Each open runtime with its device index, for reports; `Err(reason)` for the others.
    pub(crate) fn describe<T>(&self, each: impl Fn(u32, &R) -> T) -> Vec<Result<T, String>> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| match &*lock(slot) {
                Slot::Open(runtime) => Ok(each(i as u32, runtime)),
                Slot::OutOfService(reason) => Err(reason.clone()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A runtime whose context is dead once `faulted` is set, as after a sticky fault.
    struct FakeRuntime {
        generation: u32,
        faulted: Cell<bool>,
    }

    impl Runtime for FakeRuntime {
        fn faulted(&self) -> bool {
            self.faulted.get()
        }
    }

    fn fake(generation: u32) -> FakeRuntime {
        FakeRuntime {
            generation,
            faulted: Cell::new(false),
        }
    }

    fn fault(r: &FakeRuntime) -> Result<(), BackendError> {
        r.faulted.set(true);
        Err(BackendError::Device {
            device: 0,
            detail: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered".into(),
        })
    }

    fn generation(slots: &DeviceSlots<FakeRuntime>, device: u32) -> Result<u32, BackendError> {
        slots.with(device, |_| unreachable!(), |r| Ok(r.generation))
    }

    /// A device running a challenge holds its slot's lock throughout; asking for devices out
    /// of service must not wait for it (a daemon asks from an async task every few seconds).
    #[test]
    fn asking_for_devices_out_of_service_never_waits_for_a_running_challenge() {
        let slots = DeviceSlots::new(vec![fake(0)]);
        let asked = slots.with(0, |_| unreachable!(), |_| Ok(slots.out_of_service()));
        assert_eq!(asked.unwrap(), Vec::new(), "a busy device is in service");
    }

    #[test]
    fn a_fault_that_can_be_reset_ends_one_challenge_only() {
        let slots = DeviceSlots::new(vec![fake(0), fake(0)]);
        let err = slots.with(1, |_| Ok(fake(1)), fault).unwrap_err().to_string();
        assert!(
            err.contains("ILLEGAL_ADDRESS") && err.contains("reset and is ready"),
            "{err}"
        );
        assert_eq!(
            generation(&slots, 1).unwrap(),
            1,
            "a fresh runtime serves the next challenge"
        );
        assert_eq!(generation(&slots, 0).unwrap(), 0, "the other device is untouched");
        assert!(slots.out_of_service().is_empty());
    }

    /// Recovery is not guaranteed. When it fails the device is out of service: refused at once
    /// with the reason, never reopened and failed challenge after challenge.
    #[test]
    fn a_device_that_cannot_be_reset_goes_out_of_service_and_says_why() {
        let slots = DeviceSlots::new(vec![fake(0), fake(0)]);
        let err = slots
            .with(1, |_| Err("CUDA_ERROR_DEVICE_UNAVAILABLE".into()), fault)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("could not be reset (CUDA_ERROR_DEVICE_UNAVAILABLE)"),
            "{err}"
        );
        assert!(err.contains("until the miner restarts"), "{err}");

        let later = slots
            .with(1, |_| panic!("an out-of-service device is not reopened"), |_| Ok(()))
            .unwrap_err();
        let BackendError::OutOfService { device: 1, detail } = &later else {
            panic!("{later}");
        };
        assert!(
            detail.contains("ILLEGAL_ADDRESS") && detail.contains("restart the miner"),
            "{detail}"
        );
        assert_eq!(slots.out_of_service(), vec![(1, detail.clone())]);
        assert_eq!(generation(&slots, 0).unwrap(), 0, "the other device still serves");
        let described = slots.describe(|i, r| (i, r.generation));
        assert_eq!(described[0], Ok((0, 0)));
        assert!(described[1].is_err());
    }

    /// An error that leaves the context usable (out of memory, a cancel) is only passed on.
    #[test]
    fn an_error_without_a_fault_keeps_the_runtime() {
        let slots = DeviceSlots::new(vec![fake(0)]);
        let err = slots
            .with(
                0,
                |_| panic!("no reset without a fault"),
                |_| -> Result<(), _> {
                    Err(BackendError::Device {
                        device: 0,
                        detail: "a launch was refused".into(),
                    })
                },
            )
            .unwrap_err();
        assert_eq!(err.to_string(), "device 0 failed: a launch was refused");
        assert_eq!(generation(&slots, 0).unwrap(), 0);
        assert!(matches!(
            slots.get(7),
            Err(BackendError::NoSuchDevice { device: 7, count: 1 })
        ));
    }
}
